//go:build race

package wire

// raceEnabled: the race detector changes what a decode allocates, so the
// tests that bound allocations check only their errors under it.
const raceEnabled = true
