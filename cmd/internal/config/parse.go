package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// Parse reads a configuration from data; name is the file name used in
// errors. Keys the data leaves out keep Default's values, except that a
// tables list replaces the default table. The error joins every problem
// found, each an *Error.
func Parse(name string, data []byte) (Config, error) {
	root, err := decodeDocument(name, data)
	if err != nil {
		return Config{}, err
	}
	p := &parser{file: name}
	cfg := Default()
	var tablesNode *yaml.Node
	var serverKeys map[string]*yaml.Node
	var usersNode *yaml.Node
	p.mapping(root, "", []field{
		{"server", func(n *yaml.Node, key string) {
			serverKeys = p.mapping(n, key, append(serverFields(p, &cfg.Server), field{"users", p.node(&usersNode)}))
		}},
		{"log", func(n *yaml.Node, key string) { p.mapping(n, key, logFields(p, &cfg.Log)) }},
		{"stream", func(n *yaml.Node, key string) {
			keys := p.mapping(n, key, streamFields(p, &cfg))
			if s := cfg.Stream; keys["duplicates"] != nil && s.MaxAge != 0 && s.Duplicates > s.MaxAge {
				p.failf(keys["duplicates"], "stream.duplicates", "%v is longer than stream.max_age %v, which JetStream refuses: a message is gone before its resend could be recognised", s.Duplicates, s.MaxAge)
			}
		}},
		{"service", func(n *yaml.Node, key string) { p.mapping(n, key, serviceFields(p, &cfg.Service)) }},
		{"checkpoint", func(n *yaml.Node, key string) { p.mapping(n, key, checkpointFields(p, &cfg.Checkpoint)) }},
		{"limits", func(n *yaml.Node, key string) {
			keys := p.mapping(n, key, limitsFields(p, &cfg.Limits))
			p.checkLimits(cfg.Limits, keys)
		}},
		{"tables", p.node(&tablesNode)},
	})
	p.checkServer(cfg.Server, serverKeys)
	if usersNode != nil {
		cfg.Users = p.userList(usersNode, "server.users")
	}
	if tablesNode != nil {
		cfg.Tables = p.tableList(tablesNode, "tables")
	}
	if len(p.errs) > 0 {
		// Checks run section by section; report in the file's order.
		slices.SortStableFunc(p.errs, func(a, b *Error) int { return a.Line - b.Line })
		errs := make([]error, len(p.errs))
		for i, e := range p.errs {
			errs[i] = e
		}
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}

func serverFields(p *parser, s *Server) []field {
	return []field{
		{"nats", p.str(&s.NATS, nil)},
		{"nats_wait", p.duration(&s.NATSWait, false)},
		{"creds", p.str(&s.Creds, nil)},
		{"tls_ca", p.str(&s.TLSCA, nil)},
		{"tls_cert", p.str(&s.TLSCert, nil)},
		{"tls_key", p.str(&s.TLSKey, nil)},
		{"user", p.str(&s.User, nil)},
		{"password", p.str(&s.Password, nil)},
		{"nkey", p.str(&s.Nkey, nil)},
		{"inbox_prefix", p.str(&s.InboxPrefix, nil)},
		{"listen", p.str(&s.Listen, CheckListen)},
		{"listen_tls_cert", p.str(&s.ListenTLSCert, nil)},
		{"listen_tls_key", p.str(&s.ListenTLSKey, nil)},
		{"listen_tls_ca", p.str(&s.ListenTLSCA, nil)},
		{"listen_tls_verify", p.boolean(&s.ListenTLSVerify)},
		{"allow_unauthenticated", p.boolean(&s.AllowUnauthenticated)},
		{"store", p.str(&s.Store, nonEmpty("a directory such as ./reprise-data"))},
		{"max_payload", intInto(p, &s.MaxPayload, MinMaxPayload, MaxMaxPayload, "")},
		{"sync_always", p.boolean(&s.SyncAlways)},
		{"prefix", p.str(&s.Prefix, CheckPrefix)},
		{"metrics", p.str(&s.Metrics, checkMetrics)},
	}
}

func logFields(p *parser, l *Log) []field {
	return []field{
		{"format", p.str(&l.Format, CheckLogFormat)},
		{"level", p.str(&l.Level, CheckLogLevel)},
	}
}

func streamFields(p *parser, c *Config) []field {
	s := &c.Stream
	return []field{
		{"replicas", intInto(p, &s.Replicas, 1, 5, " (1, 3 or 5 copies in a clustered JetStream)")},
		{"max_bytes", intInto(p, &s.MaxBytes, 0, math.MaxInt64, " (0 for no limit)")},
		{"max_age", p.jetStreamDuration(&s.MaxAge)},
		{"duplicates", p.jetStreamDuration(&s.Duplicates)},
		{"memory", p.boolean(&s.Memory)},
	}
}

func serviceFields(p *parser, s *Service) []field {
	return []field{
		{"max_sample_wait", p.duration(&s.MaxSampleWait, true)},
		{"max_concurrent_samples", intInto(p, &s.MaxConcurrentSamples, 1, math.MaxInt32, "")},
		{"pull_bytes", intInto(p, &s.PullBytes, 1, math.MaxInt32, "")},
		{"producer_idle", p.duration(&s.ProducerIdle, false)},
		{"standby", p.boolean(&s.Standby)},
		{"lease_ttl", p.jetStreamDuration(&s.LeaseTTL)},
		{"shard", p.str(&s.Shard, CheckShard)},
		{"sample_priority", p.duration(&s.SamplePriority, false)},
		{"reply_conns", intInto(p, &s.ReplyConns, 0, MaxReplyConns, " (0: by the cores)")},
	}
}

func checkpointFields(p *parser, c *Checkpoint) []field {
	return []field{
		{"every", p.duration(&c.Every, false)},
		{"dir", p.str(&c.Dir, nil)},
		{"keep", intInto(p, &c.Keep, 1, 1000, " (at least 1; 2 leaves a way back if the newest is damaged)")},
	}
}

func limitsFields(p *parser, l *service.Limits) []field {
	return []field{
		{"max_chunk_bytes", intInto(p, &l.MaxChunkBytes, 1, wire.MaxChunkRawSize, " (at most the wire's 256 MiB)")},
		{"max_chunks_per_message", intInto(p, &l.MaxChunksPerMessage, 1, math.MaxInt32, "")},
		{"max_items_per_message", intInto(p, &l.MaxItemsPerMessage, 1, math.MaxInt32, "")},
		{"max_columns_per_item", intInto(p, &l.MaxColumnsPerItem, 1, math.MaxInt32, "")},
		{"max_slices_per_item", intInto(p, &l.MaxSlicesPerItem, 1, math.MaxInt32, "")},
		{"max_item_bytes", intInto(p, &l.MaxItemBytes, 1, math.MaxInt64, "")},
		{"max_reply_bytes", intInto(p, &l.MaxReplyBytes, 1, math.MaxInt64, "")},
		{"max_reply_bytes_in_flight", intInto(p, &l.MaxReplyBytesInFlight, 1, math.MaxInt64, "")},
		{"max_mutation_ops", intInto(p, &l.MaxMutationOps, 1, math.MaxInt32, "")},
		{"max_producers", intInto(p, &l.MaxProducers, 1, math.MaxInt32, "")},
		{"max_producer_window", intInto(p, &l.MaxProducerWindow, 1, broker.MaxProducerWindow, " (a producer's WithMaxInFlight)")},
		{"max_held_chunk_bytes", intInto(p, &l.MaxHeldChunkBytes, 1, math.MaxInt64, "")},
		{"max_held_message_bytes", intInto(p, &l.MaxHeldMessageBytes, 1, math.MaxInt64, "")},
		{"max_pending_items", intInto(p, &l.MaxPendingItems, 1, math.MaxInt32, "")},
		{"max_pending_bytes", intInto(p, &l.MaxPendingBytes, 1, math.MaxInt64, "")},
	}
}

// checkLimits reports the limits that contradict each other, which the
// service would refuse only once the server had started.
func (p *parser) checkLimits(l service.Limits, keys map[string]*yaml.Node) {
	if l.MaxReplyBytes >= l.MaxItemBytes {
		return
	}
	key := "max_reply_bytes"
	if keys[key] == nil {
		key = "max_item_bytes"
	}
	if n := keys[key]; n != nil {
		p.failf(n, "limits."+key, "limits.max_reply_bytes %d is below limits.max_item_bytes %d: an item that large could never be sampled; raise max_reply_bytes or lower max_item_bytes", l.MaxReplyBytes, l.MaxItemBytes)
	}
}

// Limits of max_payload: a message must have room for a chunk and its
// headers, and JetStream's file store refuses a record over 32 MiB (the
// message with its subject and 30 bytes of its own), whatever NATS would
// carry: 64 KiB are left for the subject.
const (
	MinMaxPayload = 1 << 10
	MaxMaxPayload = 32<<20 - 64<<10
)

// MaxReplyConns bounds service.reply_conns: past the cores of a large
// machine, more connections only cost the server a reader each.
const MaxReplyConns = 64

// embeddedOnly are the server keys that configure the embedded server, and
// externalOnly those that configure the connection to an external one.
var (
	embeddedOnly = []string{"listen", "store", "max_payload", "sync_always", "users", "listen_tls_cert", "listen_tls_key", "listen_tls_ca", "listen_tls_verify", "allow_unauthenticated"}
	externalOnly = []string{"creds", "tls_ca", "tls_cert", "tls_key", "user", "password", "nkey", "inbox_prefix"}
)

// checkServer reports settings that contradict each other.
func (p *parser) checkServer(s Server, keys map[string]*yaml.Node) {
	for _, k := range embeddedOnly {
		if n := keys[k]; n != nil && !s.Embedded() {
			p.failf(n, "server."+k, "configures the embedded server, but server.nats selects an external one: remove one of them")
		}
	}
	for _, k := range externalOnly {
		if n := keys[k]; n != nil && s.Embedded() {
			p.failf(n, "server."+k, "configures the connection to an external server: set server.nats too, or remove it")
		}
	}
	p.checkAuth(s, keys)
	if (s.TLSCert == "") != (s.TLSKey == "") {
		n := keys["tls_cert"]
		if n == nil {
			n = keys["tls_key"]
		}
		p.failf(n, "server.tls_cert", "a client certificate needs both tls_cert and tls_key")
	}
	if (s.ListenTLSCert == "") != (s.ListenTLSKey == "") {
		n := keys["listen_tls_cert"]
		if n == nil {
			n = keys["listen_tls_key"]
		}
		p.failf(n, "server.listen_tls_cert", "TLS needs both listen_tls_cert and listen_tls_key")
	}
	if n := keys["listen_tls_ca"]; n != nil && !s.ListenTLSVerify {
		p.failf(n, "server.listen_tls_ca", "the CA verifies client certificates: set listen_tls_verify: true, or remove it")
	}
	if n := keys["listen_tls_verify"]; n != nil && s.ListenTLSVerify && s.ListenTLSCert == "" {
		p.failf(n, "server.listen_tls_verify", "verifying client certificates needs TLS: set listen_tls_cert and listen_tls_key")
	}
}

// checkAuth reports the connection settings natsconn.Config.Check would
// refuse, by their keys here, so that an error names the line to fix. A
// user without a password may get it from $NATS_PASSWORD.
func (p *parser) checkAuth(s Server, keys map[string]*yaml.Node) {
	if s.Embedded() {
		return
	}
	if n := keys["password"]; n != nil && s.User == "" {
		p.failf(n, "server.password", "a password needs server.user")
	}
	var ways []string
	for _, k := range []string{"user", "nkey", "creds"} {
		if keys[k] == nil {
			continue
		}
		if ways = append(ways, "server."+k); len(ways) == 2 {
			p.failf(keys[k], "server."+k, "%s and %s are different ways to authenticate: give one", ways[0], ways[1])
		}
	}
	if n := keys["inbox_prefix"]; n != nil {
		if strings.ContainsAny(s.InboxPrefix, "*> \t") || strings.HasPrefix(s.InboxPrefix, ".") || strings.HasSuffix(s.InboxPrefix, ".") {
			p.failf(n, "server.inbox_prefix", "want a subject without wildcards or spaces, not starting or ending in a dot")
		}
	} else if n := keys["user"]; n != nil {
		if err := broker.CheckUser(s.User); err != nil {
			p.failf(n, "server.user", "%v (or set server.inbox_prefix)", err)
		}
	}
}

func userFields(p *parser, u *User) []field {
	return []field{
		{"role", p.str((*string)(&u.Role), oneOf("role", roleNames()...))},
		{"name", p.str(&u.Name, nil)},
		{"password", p.str(&u.Password, nil)},
		{"nkey", p.str(&u.Nkey, nil)},
	}
}

func roleNames() []string {
	var names []string
	for _, r := range broker.Roles() {
		names = append(names, string(r))
	}
	return names
}

// userList reads the embedded server's users.
func (p *parser) userList(n *yaml.Node, key string) []User {
	if n.Kind != yaml.SequenceNode {
		p.failf(n, key, "want a list of users, each {name: alice, role: actor, password: ...} or {nkey: U..., role: learner}, got %s", describeHidden(n))
		return nil
	}
	if len(n.Content) == 0 {
		p.failf(n, key, "the list is empty: add a user, or remove users to let any client in (on loopback only)")
		return nil
	}
	var users []User
	lines := make(map[string]int)
	for i, un := range n.Content {
		un = resolve(un)
		ukey := fmt.Sprintf("%s[%d]", key, i)
		if un.Kind != yaml.MappingNode {
			p.failf(un, ukey, "want a user, {name: alice, role: actor, password: ...} or {nkey: U..., role: learner}, got %s", describeHidden(un))
			continue
		}
		var u User
		before := len(p.errs)
		keys := p.mapping(un, ukey, userFields(p, &u))
		if len(p.errs) > before {
			continue
		}
		if keys["role"] == nil {
			p.failf(un, ukey, "no role: add role: with one of %s", strings.Join(roleNames(), ", "))
			continue
		}
		if err := u.Check(); err != nil {
			p.fail(un, ukey, err)
			continue
		}
		if line, dup := lines[u.ID()]; dup {
			p.failf(un, ukey, "user %s is already defined at line %d", u.ID(), line)
			continue
		}
		lines[u.ID()] = un.Line
		users = append(users, u)
	}
	return users
}

func nonEmpty(what string) func(string) error {
	return func(s string) error {
		if s == "" {
			return fmt.Errorf("empty: want %s", what)
		}
		return nil
	}
}

// CheckListen checks an embedded server's listen address: HOST:PORT with a
// port in [0, 65535], or -1 for a free one.
func CheckListen(s string) error { return checkHostPort(s, true) }

func checkMetrics(s string) error {
	if s == "" {
		return nil
	}
	return CheckMetrics(s)
}

// CheckMetrics checks a metrics address: HOST:PORT, with port 0 for a free
// one.
func CheckMetrics(s string) error { return checkHostPort(s, false) }

func checkHostPort(s string, allowMinusOne bool) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not HOST:PORT (e.g. 127.0.0.1:4222, or 0.0.0.0:4222 for every interface)", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n > 65535 || n < -1 || (n == -1 && !allowMinusOne) {
		return fmt.Errorf("%q: port %q is not a number in [0, 65535]", s, port)
	}
	return nil
}

// CheckPrefix checks a subject prefix: dot-separated tokens without spaces
// or NATS wildcards.
func CheckPrefix(s string) error {
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || strings.ContainsAny(tok, " \t\r\n*>") {
			return fmt.Errorf("%q is not a subject prefix: want dot-separated tokens without spaces, * or > (e.g. reprise or reprise.team1)", s)
		}
	}
	return nil
}

// CheckLogFormat and CheckLogLevel check the log settings.
var (
	CheckLogFormat = oneOf("log format", "text", "json")
	CheckLogLevel  = oneOf("log level", "debug", "info", "warn", "error")
)

// Rate limiter presets and the parameters each takes.
const (
	presetMinSize = "min_size"
	presetRatio   = "sample_to_insert_ratio"
	presetQueue   = "queue"
	presetStack   = "stack"
	presetCustom  = "custom"
)

var presetParams = map[string][]string{
	presetMinSize: {"min_size"},
	presetRatio:   {"samples_per_insert", "min_size", "error_buffer"},
	presetQueue:   nil,
	presetStack:   nil,
	presetCustom:  {"samples_per_insert", "min_size", "min_diff", "max_diff"},
}

var presetNames = []string{presetMinSize, presetRatio, presetQueue, presetStack, presetCustom}

// limiterSpec is a rate_limiter mapping as written.
type limiterSpec struct {
	preset                        string
	samplesPerInsert, errorBuffer float64
	minDiff, maxDiff              float64
	minSize                       int64
	keys                          map[string]*yaml.Node
}

func limiterFields(p *parser, l *limiterSpec) []field {
	return []field{
		{"preset", p.str(&l.preset, oneOf("rate limiter preset", presetNames...))},
		{"samples_per_insert", p.number(&l.samplesPerInsert, finiteAtLeast(0, true))},
		{"min_size", intInto(p, &l.minSize, 1, math.MaxInt64, " (the table size below which no sample is allowed; at least 1)")},
		{"error_buffer", p.number(&l.errorBuffer, finiteAtLeast(0, false))},
		{"min_diff", p.number(&l.minDiff, nil)},
		{"max_diff", p.number(&l.maxDiff, nil)},
	}
}

// rateLimiter reads a rate_limiter mapping. The queue and stack presets are
// built by the table, which knows the size.
func (p *parser) rateLimiter(n *yaml.Node, key string) (limiterSpec, bool) {
	l := limiterSpec{minSize: 1}
	before := len(p.errs)
	l.keys = p.mapping(n, key, limiterFields(p, &l))
	if len(p.errs) > before {
		return l, false
	}
	if l.keys["preset"] == nil {
		p.failf(n, key, "no preset: add preset: with one of %s", strings.Join(presetNames, ", "))
		return l, false
	}
	params := presetParams[l.preset]
	for k, v := range l.keys {
		if k == "preset" || contains(params, k) {
			continue
		}
		switch {
		case len(params) == 0:
			p.failf(v, joinKey(key, k), "preset %s takes no parameters (its size is the table's max_size): remove %s", l.preset, k)
		default:
			p.failf(v, joinKey(key, k), "not a parameter of preset %s (it takes %s): remove it, or use preset custom", l.preset, strings.Join(params, ", "))
		}
	}
	required := params
	if l.preset == presetMinSize {
		required = nil // min_size defaults to 1
	}
	for _, k := range required {
		if l.keys[k] == nil {
			p.failf(n, key, "preset %s needs %s (it takes %s)", l.preset, k, strings.Join(params, ", "))
		}
	}
	return l, len(p.errs) == before
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// config builds the limiter; maxSize sizes the queue and stack presets.
func (l limiterSpec) config(maxSize int64) (limiter.Config, error) {
	switch l.preset {
	case presetMinSize:
		return limiter.MinSize(l.minSize), nil
	case presetRatio:
		return limiter.SampleToInsertRatio(l.samplesPerInsert, l.minSize, l.errorBuffer)
	case presetQueue:
		return limiter.Queue(maxSize), nil
	case presetStack:
		return limiter.Stack(maxSize), nil
	}
	c := limiter.Config{SamplesPerInsert: l.samplesPerInsert, MinSize: l.minSize, MinDiff: l.minDiff, MaxDiff: l.maxDiff}
	return c, c.Validate()
}

var selectorKinds = []string{
	string(selectors.KindFifo), string(selectors.KindLifo), string(selectors.KindUniform),
	string(selectors.KindPrioritized), string(selectors.KindMaxHeap), string(selectors.KindMinHeap),
}

// selector reads a sampler or remover: a kind (sampler: uniform), or a
// mapping with a kind and, for prioritized, an exponent.
func (p *parser) selector(n *yaml.Node, key string) (selectors.Options, bool) {
	checkKind := oneOf("selector kind", selectorKinds...)
	var (
		o        selectors.Options
		kind     string
		exponent float64
	)
	before := len(p.errs)
	var keys map[string]*yaml.Node
	if n.Kind == yaml.ScalarNode {
		p.str(&kind, checkKind)(n, key)
		keys = map[string]*yaml.Node{"kind": n}
	} else {
		keys = p.mapping(n, key, []field{
			{"kind", p.str(&kind, checkKind)},
			{"exponent", p.number(&exponent, finiteAtLeast(0, false))},
		})
	}
	if len(p.errs) > before {
		return o, false
	}
	o = selectors.Options{Kind: selectors.Kind(kind), Exponent: exponent}
	switch {
	case keys["kind"] == nil:
		p.failf(n, key, "no kind: add kind: with one of %s", strings.Join(selectorKinds, ", "))
	case o.Kind == selectors.KindPrioritized && keys["exponent"] == nil:
		p.failf(n, key, "prioritized needs an exponent: write {kind: prioritized, exponent: 0.6} (0 samples every positive priority alike, 1 in proportion to priority)")
	case o.Kind != selectors.KindPrioritized && keys["exponent"] != nil:
		p.failf(keys["exponent"], joinKey(key, "exponent"), "only prioritized takes an exponent: remove it")
	default:
		if err := o.Validate(); err != nil {
			p.fail(n, key, err)
		}
	}
	return o, len(p.errs) == before
}

// tableList reads the tables list.
func (p *parser) tableList(n *yaml.Node, key string) []tables.Config {
	if n.Kind != yaml.SequenceNode {
		p.failf(n, key, "want a list of tables, each starting with \"- name: ...\", got %s", describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		p.failf(n, key, "the list is empty: define a table, or remove tables to serve the default table %q", DefaultTableName)
		return nil
	}
	var out []tables.Config
	lines := make(map[string]int)
	for i, tn := range n.Content {
		tn = resolve(tn)
		cfg, ok := p.table(tn, fmt.Sprintf("%s[%d]", key, i))
		if !ok {
			continue
		}
		if line, dup := lines[cfg.Name]; dup {
			p.failf(tn, fmt.Sprintf("%s[%d].name", key, i), "table %q is already defined at line %d: table names must be unique", cfg.Name, line)
			continue
		}
		lines[cfg.Name] = tn.Line
		out = append(out, cfg)
	}
	return out
}

// tableSpec is a table mapping as written.
type tableSpec struct {
	cfg                                      tables.Config
	sampler, remover, rateLimiter, signature *yaml.Node
}

func tableFields(p *parser, t *tableSpec) []field {
	return []field{
		{"name", p.str(&t.cfg.Name, nonEmpty("a table name"))},
		{"sampler", p.node(&t.sampler)},
		{"remover", p.node(&t.remover)},
		{"max_size", intInto(p, &t.cfg.MaxSize, 1, tables.MaxTableSize, " (the most items the table holds)")},
		{"max_times_sampled", intInto(p, &t.cfg.MaxTimesSampled, math.MinInt32, math.MaxInt32, " (below 1 for unlimited, as in Reverb)")},
		{"rate_limiter", p.node(&t.rateLimiter)},
		{"signature", p.node(&t.signature)},
		{"max_staleness", func(n *yaml.Node, key string) {
			if v, ok := p.integer(n, key, 0, math.MaxInt64, " (policy versions an item may lag the table's current one; 0 keeps only the current)"); ok {
				t.cfg.MaxStaleness = &v
			}
		}},
	}
}

// table reads one table. Defaults follow the rate limiter: a queue samples
// and evicts fifo, a stack lifo, each item once; any other table samples
// uniformly, evicts fifo and samples items without limit.
func (p *parser) table(n *yaml.Node, key string) (tables.Config, bool) {
	var t tableSpec
	before := len(p.errs)
	keys := p.mapping(n, key, tableFields(p, &t))
	if keys == nil && len(p.errs) > before {
		return tables.Config{}, false
	}
	if keys["name"] == nil {
		p.failf(n, key, "no name: every table needs one, e.g. name: replay")
	}
	if keys["max_size"] == nil {
		p.failf(n, key, "no max_size: add the most items the table holds, e.g. max_size: 1000000")
	}
	lim := limiterSpec{preset: presetMinSize, minSize: 1}
	limOK := true
	if t.rateLimiter != nil {
		lim, limOK = p.rateLimiter(t.rateLimiter, key+".rate_limiter")
	}
	sampler, remover, times := selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, int32(0)
	switch lim.preset {
	case presetQueue:
		sampler, remover, times = selectors.Options{Kind: selectors.KindFifo}, selectors.Options{Kind: selectors.KindFifo}, 1
	case presetStack:
		sampler, remover, times = selectors.Options{Kind: selectors.KindLifo}, selectors.Options{Kind: selectors.KindLifo}, 1
	}
	if keys["max_times_sampled"] == nil {
		t.cfg.MaxTimesSampled = times
	}
	t.cfg.Sampler, t.cfg.Remover = sampler, remover
	if t.sampler != nil {
		t.cfg.Sampler, _ = p.selector(t.sampler, key+".sampler")
	}
	if t.remover != nil {
		t.cfg.Remover, _ = p.selector(t.remover, key+".remover")
	}
	if t.signature != nil {
		t.cfg.Signature = p.signature(t.signature, key+".signature")
	}
	if len(p.errs) > before || !limOK {
		return tables.Config{}, false
	}
	if lim.preset == presetQueue || lim.preset == presetStack {
		p.checkPreset(key, lim.preset, t, keys, sampler, remover)
		if len(p.errs) > before {
			return tables.Config{}, false
		}
	}
	cfg, err := lim.config(t.cfg.MaxSize)
	if err != nil {
		at := n
		if t.rateLimiter != nil {
			at = t.rateLimiter
		}
		p.fail(at, key+".rate_limiter", err)
		return tables.Config{}, false
	}
	t.cfg.Limiter = cfg
	if err := t.cfg.Validate(); err != nil {
		p.fail(n, key, err)
		return tables.Config{}, false
	}
	return t.cfg, true
}

// checkPreset rejects a queue or stack whose selectors or
// max_times_sampled would make it something else.
func (p *parser) checkPreset(key, preset string, t tableSpec, keys map[string]*yaml.Node, sampler, remover selectors.Options) {
	fix := fmt.Sprintf("remove the line (a %s sets it), or use preset custom", preset)
	if t.cfg.Sampler != sampler {
		p.failf(t.sampler, key+".sampler", "a %s samples %s, not %s: %s", preset, sampler, t.cfg.Sampler, fix)
	}
	if t.cfg.Remover != remover {
		p.failf(t.remover, key+".remover", "a %s evicts %s, not %s: %s", preset, remover, t.cfg.Remover, fix)
	}
	if n := keys["max_times_sampled"]; n != nil && t.cfg.MaxTimesSampled != 1 {
		p.failf(n, key+".max_times_sampled", "a %s samples each item once, not %d times: %s", preset, t.cfg.MaxTimesSampled, fix)
	}
}

// signature reads a list of columns, each {name, dtype, shape}.
func (p *parser) signature(n *yaml.Node, key string) tables.Signature {
	if n.Kind != yaml.SequenceNode {
		p.failf(n, key, "want a list of columns, each {name: obs, dtype: float32, shape: [84, 84]}, got %s", describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		// A table with an empty signature takes only items of no columns,
		// and there are none: it would refuse every item.
		p.failf(n, key, "the list is empty, which would refuse every item: list the columns, or remove signature to take items of any columns")
		return nil
	}
	sig := make(tables.Signature, 0, len(n.Content))
	names := make(map[string]int)
	for i, cn := range n.Content {
		cn = resolve(cn)
		ckey := fmt.Sprintf("%s[%d]", key, i)
		var (
			col   tables.ColumnSpec
			shape *yaml.Node
		)
		keys := p.mapping(cn, ckey, []field{
			{"name", p.str(&col.Name, nonEmpty("a column name"))},
			{"dtype", p.str(&col.DType, checkDType)},
			{"shape", p.node(&shape)},
		})
		if keys == nil {
			continue
		}
		for _, k := range []string{"name", "dtype", "shape"} {
			if keys[k] == nil {
				p.failf(cn, ckey, "no %s: a column needs name, dtype and shape (shape: [] for a scalar)", k)
			}
		}
		if shape != nil {
			col.Shape = p.shape(shape, ckey+".shape")
		}
		if col.Name != "" {
			if line, dup := names[col.Name]; dup {
				p.failf(cn, ckey+".name", "column %q is already defined at line %d", col.Name, line)
			}
			names[col.Name] = cn.Line
		}
		sig = append(sig, col)
	}
	return sig
}

func (p *parser) shape(n *yaml.Node, key string) []int64 {
	if n.Kind != yaml.SequenceNode {
		p.failf(n, key, "want a list of sizes such as [84, 84] ([] for a scalar, -1 for any size), got %s", describe(n))
		return nil
	}
	shape := make([]int64, len(n.Content))
	for i, d := range n.Content {
		intInto(p, &shape[i], -1, math.MaxInt64, " (-1 matches any size)")(resolve(d), fmt.Sprintf("%s[%d]", key, i))
	}
	return shape
}

func checkDType(s string) error {
	if _, err := wire.ElemSize(s); err != nil {
		return fmt.Errorf("unknown dtype %q: want a numpy name (bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64, complex64 or complex128)", s)
	}
	return nil
}
