package broker

import "log/slog"

// Option is an option that both the Producer and the Client take.
type Option interface {
	ProducerOption
	ClientOption
}

// WithPrefix sets the subject prefix of the deployment (default
// DefaultPrefix). Deployments with different prefixes share a NATS server
// without seeing each other.
func WithPrefix(prefix string) Option { return prefixOption(prefix) }

type prefixOption string

func (p prefixOption) configureProducer(o *producerOptions) error { o.prefix = string(p); return nil }
func (p prefixOption) configureClient(o *clientOptions) error     { o.prefix = string(p); return nil }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return loggerOption{l} }

type loggerOption struct{ l *slog.Logger }

func (l loggerOption) configureProducer(o *producerOptions) error { o.logger = l.l; return nil }
func (l loggerOption) configureClient(o *clientOptions) error     { o.logger = l.l; return nil }

// WithReturnOnStore makes the Producer's Flush and the Client's mutations
// (Mutate, UpdatePriorities, Delete) return once JetStream has stored what
// they sent, which makes it durable, without waiting for the table service
// to apply it: a round trip sooner, but a sample or info right after may
// not see it yet, nor does a mutation the service refuses fail. By default
// they return once it is applied and visible, as Reverb's flush and
// mutate_priorities do.
func WithReturnOnStore() Option { return returnOnStoreOption{} }

type returnOnStoreOption struct{}

func (returnOnStoreOption) configureProducer(o *producerOptions) error {
	o.returnOnStore = true
	return nil
}

func (returnOnStoreOption) configureClient(o *clientOptions) error {
	o.returnOnStore = true
	return nil
}
