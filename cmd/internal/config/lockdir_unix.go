//go:build unix

package config

import (
	"os"
	"syscall"
)

// lockDir holds an exclusive lock on dir until the returned func is
// called, so that services starting together claim it one after another:
// replacing an empty owner file, or creating one in place, is otherwise
// seen half done by the other. Where the file system keeps no locks, it
// goes unlocked, as before.
func lockDir(dir string) func() {
	d, err := os.Open(dir)
	if err != nil {
		return func() {}
	}
	for {
		err = syscall.Flock(int(d.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		d.Close()
		return func() {}
	}
	return func() { d.Close() }
}
