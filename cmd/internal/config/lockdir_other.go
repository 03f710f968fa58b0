//go:build !unix

package config

import "context"

// lockDir takes no lock where flock is missing.
func lockDir(context.Context, string) (func(), error) { return func() {}, nil }
