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
