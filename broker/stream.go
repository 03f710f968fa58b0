package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/reprise-rl/reprise/broker/internal/protocol"
)

// waitStream waits until the deployment's stream exists, asking with
// STREAM.INFO only, so that a producer needs no right to create or change
// it (an actor may not). It logs once what it waits for, and on ctx's end
// returns why it gave up, with the connection's last error (a permissions
// violation says which subject the user lacks).
func waitStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, subj protocol.Subjects, log *slog.Logger) error {
	name := subj.Stream()
	wait := 50 * time.Millisecond
	logged := false
	for {
		_, err := js.Stream(ctx, name)
		if err == nil {
			if logged {
				log.Info("producer: stream found", "stream", name)
			}
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) && !protocol.RetryableJSError(err) && ctx.Err() == nil {
			return fmt.Errorf("broker: stream %s: %w", name, err)
		}
		if !logged {
			log.Info("producer: waiting for the table service to create the stream", "stream", name, "prefix", subj.Prefix, "reason", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			last := ""
			if lerr := nc.LastError(); lerr != nil {
				last = fmt.Sprintf("; connection's last error: %v", lerr)
			}
			return fmt.Errorf("broker: waiting for stream %s (is the table service running with prefix %q?): %w (last answer: %v%s)", name, subj.Prefix, ctx.Err(), err, last)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}
