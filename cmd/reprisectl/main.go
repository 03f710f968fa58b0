// Command reprisectl is the operator's tool for a Reprise deployment:
//
//	reprisectl info [--json] [TABLE]    show the tables
//	reprisectl reset TABLE | --all      empty a table
//	reprisectl bench [--mode insert|sample|mixed] [--clients N] [--payload BYTES] ...
//
// Every command takes --nats URL (default nats://127.0.0.1:4222, where
// reprised listens by default) and --prefix. Ctrl-C stops a bench early and
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
