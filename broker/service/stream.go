package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/reprise-rl/reprise/broker/internal/protocol"
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

func (o StreamOptions) config(subj protocol.Subjects) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:        subj.Stream(),
		Description: "Reprise inserts and mutations for prefix " + subj.Prefix,
		Subjects:    []string{subj.Data()},
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
func ensureStream(ctx context.Context, js jetstream.JetStream, subj protocol.Subjects, o StreamOptions, log *slog.Logger) (jetstream.Stream, error) {
	cfg := o.config(subj)
	var s jetstream.Stream
	err := retryJS(ctx, log, "the stream "+cfg.Name, func(ctx context.Context) error {
		var err error
		if s, err = js.CreateStream(ctx, cfg); !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return err // created, or there with this very configuration
		}
		// Prefixes that differ only in case, '.', '-' or '_' name the same
		// stream: updating another prefix's would take its subjects away
		// from that deployment's producers.
		existing, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			return err
		}
		if have := existing.CachedInfo().Config.Subjects; !slices.Equal(have, cfg.Subjects) {
			return fmt.Errorf("%w: it holds subjects %q, not %q: another deployment's prefix names the same stream (prefixes that differ only in case, '.', '-' or '_' do); give this one a prefix of its own", protocol.ErrInvalidOption, have, cfg.Subjects)
		}
		s, err = js.UpdateStream(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("broker: stream %s: %w", cfg.Name, err)
	}
	return s, nil
}
