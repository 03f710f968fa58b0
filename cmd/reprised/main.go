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
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/reprise-rl/reprise/cmd/internal/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one kills at once.
	context.AfterFunc(ctx, stop)
	code := daemon.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
