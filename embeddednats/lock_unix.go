//go:build unix

package embeddednats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockStore takes an exclusive lock on dir for as long as the returned
// file stays open; the system releases it when the process dies, however it
// dies. nats-server takes none, and two servers on one store corrupt each
// other's streams.
func lockStore(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: JetStream store dir %s: %v", ErrStartFailed, dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: JetStream store dir %s: %v", ErrStartFailed, dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOLCK) || errors.Is(err, syscall.EINVAL) {
			// A file system that keeps no locks (some network ones): as
			// with nats-server itself, keeping two servers off one store
			// is the operator's job there.
			return nil, nil
		}
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: JetStream store dir %s is in use by another NATS server (another reprised?): give each its own store dir", ErrStartFailed, dir)
		}
		return nil, fmt.Errorf("%w: locking JetStream store dir %s: %v", ErrStartFailed, dir, err)
	}
	return f, nil
}
