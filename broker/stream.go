package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamOptions sets the limits of the stream that carries a deployment's
// inserts and mutations. The zero value keeps everything (no byte or age
// limit), on file storage, with one replica and JetStream's default dedupe
// window.
type StreamOptions struct {
	// Replicas is the number of copies in a clustered JetStream (1, 3 or 5).
	Replicas int
	// MaxBytes caps the stream's size; the oldest messages go first. 0 means
	// unlimited. Messages removed before a checkpoint covers them are lost
	// to recovery, so size it for the checkpoint interval.
	MaxBytes int64
	// MaxAge drops messages older than this; 0 means never.
	MaxAge time.Duration
	// Duplicates is the window in which a resent message (same producer
	// and sequence) is recognised and dropped; 0 means the server default
	// (2 minutes).
	Duplicates time.Duration
	// Memory keeps the stream in memory instead of on disk: faster, and
	// lost with the server.
	Memory bool
}

func (o StreamOptions) config(subj subjects) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:        subj.stream(),
		Description: "Reprise inserts and mutations for prefix " + subj.prefix,
		Subjects:    []string{subj.data()},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxBytes:    -1,
		MaxMsgs:     -1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(o.Replicas, 1),
		MaxAge:      o.MaxAge,
		Duplicates:  o.Duplicates,
	}
	if o.MaxBytes > 0 {
		cfg.MaxBytes = o.MaxBytes
	}
	if o.Memory {
		cfg.Storage = jetstream.MemoryStorage
	}
	return cfg
}

// ensureStream creates the stream, or gives an existing one the limits o
// sets. Only the table service (and admins) may: a producer waits for the
// stream with waitStream.
func ensureStream(ctx context.Context, js jetstream.JetStream, subj subjects, o StreamOptions) (jetstream.Stream, error) {
	cfg := o.config(subj)
	for {
		s, err := js.CreateOrUpdateStream(ctx, cfg)
		if err == nil {
			return s, nil
		}
		// A cluster answers JetStream API calls only once it has a meta
		// leader; until then calls fail and are worth retrying.
		if !retryableJSError(err) {
			return nil, fmt.Errorf("broker: stream %s: %w", cfg.Name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("broker: stream %s: %w (last error: %v)", cfg.Name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitStream waits until the deployment's stream exists, asking with
// STREAM.INFO only, so that a producer needs no right to create or change
// it (an actor may not). It logs once what it waits for, and on ctx's end
// returns why it gave up, with the connection's last error (a permissions
// violation says which subject the user lacks).
func waitStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, subj subjects, log *slog.Logger) error {
	name := subj.stream()
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
		if !errors.Is(err, jetstream.ErrStreamNotFound) && !retryableJSError(err) && ctx.Err() == nil {
			return fmt.Errorf("broker: stream %s: %w", name, err)
		}
		if !logged {
			log.Info("producer: waiting for the table service to create the stream", "stream", name, "prefix", subj.prefix, "reason", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			last := ""
			if lerr := nc.LastError(); lerr != nil {
				last = fmt.Sprintf("; connection's last error: %v", lerr)
			}
			return fmt.Errorf("broker: waiting for stream %s (is the table service running with prefix %q?): %w (last answer: %v%s)", name, subj.prefix, ctx.Err(), err, last)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

func retryableJSError(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 10008: JetStream temporarily unavailable (no meta leader yet).
		return apiErr.ErrorCode == 10008 || apiErr.Code == 503
	}
	// Someone else created the stream between the service's look-up and
	// its create: the next attempt finds it and updates it.
	return errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}
