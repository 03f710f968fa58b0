// Command reprised runs a Reprise table service: experience replay tables
// for reinforcement learning, served over NATS JetStream. With no flags it
// starts an embedded NATS server on 127.0.0.1:4222, stores its data in
// ./reprise-data and serves one uniform table, "replay".
//
//	go run ./cmd/reprised                        # embedded server, default table
//	go run ./cmd/reprised --config reprise.yaml  # tables and settings from a file
//	go run ./cmd/reprised --nats nats://host:4222 --creds user.creds
//
// SIGINT and SIGTERM stop it cleanly: requests in progress finish, then the
// server shuts down. See reprise.example.yaml for every setting.
//
// Unless GOGC is set, reprised paces its garbage collector with package
// gcpace: the heap keeps about 256 MiB of garbage over its live data (at
// most four times a live heap under 64 MiB, half of one over 512 MiB),
// where Go's default is as much garbage as live data.
// Once it has rested for gcpace.RestAfter (no inserts, no samples) it
// returns its free memory to the system.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/reprise-rl/reprise/cmd/internal/daemon"
	"github.com/reprise-rl/reprise/internal/gcpace"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one kills at once.
	context.AfterFunc(ctx, stop)
	paced := make(chan struct{})
	go func() {
		defer close(paced)
		gcpace.Run(ctx, 250*time.Millisecond, gcpace.RestAfter)
	}()
	code := daemon.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	<-paced
	os.Exit(code)
}
