//go:build !unix

package embeddednats

import "os"

// lockStore takes no lock where flock is missing: there, as with
// nats-server itself, keeping two servers off one store is the operator's
// job.
func lockStore(string) (*os.File, error) { return nil, nil }
