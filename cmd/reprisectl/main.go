// Command reprisectl is the operator's tool for a Reprise deployment:
//
//	reprisectl info [--json] [TABLE]    show the tables
//	reprisectl reset TABLE | --all      empty a table
//	reprisectl checkpoint               write a checkpoint now
//	reprisectl bench [--mode insert|sample|mixed] [--clients N] [--payload BYTES] ...
//	reprisectl permissions [--role ROLE] nats-server users for each role
//
// Every command but permissions takes --nats URL (default
// nats://127.0.0.1:4222, where reprised listens by default), --prefix, and
// how to authenticate (--user and --password, --nkey SEED_FILE or --creds
// FILE; --tls-ca, --tls-cert, --tls-key). Ctrl-C stops a bench early and
// prints what it measured.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/reprise-rl/reprise/cmd/internal/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := ctl.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
