package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

const exampleFile = "../../../reprise.example.yaml"

func TestExampleFile(t *testing.T) {
	cfg, err := Load(exampleFile)
	if err != nil {
		t.Fatalf("the example configuration does not parse: %v", err)
	}
	def := Default()
	if cfg.Server != def.Server || cfg.Log != def.Log || cfg.Stream != def.Stream || cfg.Service != def.Service {
		t.Errorf("the example's settings differ from the defaults it documents:\n got %+v %+v %+v %+v\nwant %+v %+v %+v %+v",
			cfg.Server, cfg.Log, cfg.Stream, cfg.Service, def.Server, def.Log, def.Stream, def.Service)
	}
	if len(cfg.Tables) != 4 {
		t.Fatalf("got %d tables, want 4", len(cfg.Tables))
	}
	if !reflect.DeepEqual(cfg.Tables[0], DefaultTable()) {
		t.Errorf("table replay = %+v, want the default table %+v", cfg.Tables[0], DefaultTable())
	}
	ratio, err := limiter.SampleToInsertRatio(4, 1000, 400)
	if err != nil {
		t.Fatal(err)
	}
	wantPrio := tables.Config{
		Name:    "prioritized",
		Sampler: selectors.Options{Kind: selectors.KindPrioritized, Exponent: 0.6},
		Remover: selectors.Options{Kind: selectors.KindMinHeap},
		MaxSize: 100000,
		Limiter: ratio,
		Signature: tables.Signature{
			{Name: "observation", DType: "uint8", Shape: []int64{-1, 84, 84}},
			{Name: "action", DType: "int32", Shape: []int64{-1}},
			{Name: "reward", DType: "float32", Shape: []int64{-1}},
		},
	}
	if !reflect.DeepEqual(cfg.Tables[1], wantPrio) {
		t.Errorf("table prioritized = %+v, want %+v", cfg.Tables[1], wantPrio)
	}
	if want := tables.QueueConfig("rollouts", 1000); !reflect.DeepEqual(cfg.Tables[2], want) {
		t.Errorf("table rollouts = %+v, want %+v", cfg.Tables[2], want)
	}
	wantCustom := tables.Config{
		Name: "custom", Sampler: selectors.Options{Kind: selectors.KindUniform}, Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: 50000, MaxTimesSampled: 8,
		Limiter: limiter.Config{SamplesPerInsert: 2, MinSize: 100, MinDiff: 0, MaxDiff: math.Inf(1)},
	}
	if !reflect.DeepEqual(cfg.Tables[3], wantCustom) {
		t.Errorf("table custom = %+v, want %+v", cfg.Tables[3], wantCustom)
	}
}

// TestExampleDocumentsEveryKey keeps the example configuration complete: a
// key added to the parser must be documented there.
func TestExampleDocumentsEveryKey(t *testing.T) {
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	p := &parser{}
	var (
		c  Config
		ts tableSpec
		ls limiterSpec
		u  User
	)
	sections := map[string][]field{
		"server":       serverFields(p, &c.Server),
		"log":          logFields(p, &c.Log),
		"stream":       streamFields(p, &c),
		"service":      serviceFields(p, &c.Service),
		"table":        tableFields(p, &ts),
		"rate_limiter": limiterFields(p, &ls),
		"users":        append(userFields(p, &u), field{key: "users"}),
	}
	text := string(data)
	for section, fields := range sections {
		for _, f := range fields {
			if !strings.Contains(text, f.key+":") {
				t.Errorf("%s key %q is not in %s", section, f.key, exampleFile)
			}
		}
	}
	for _, preset := range presetNames {
		if !strings.Contains(text, preset) {
			t.Errorf("rate limiter preset %q is not in %s", preset, exampleFile)
		}
	}
	for _, kind := range selectorKinds {
		if !strings.Contains(text, kind) {
			t.Errorf("selector kind %q is not in %s", kind, exampleFile)
		}
	}
}

func TestEmptyFileIsDefault(t *testing.T) {
	for _, data := range []string{"", "# only a comment\n", "---\n"} {
		cfg, err := Parse("empty.yaml", []byte(data))
		if err != nil {
			t.Fatalf("Parse(%q): %v", data, err)
		}
		if !reflect.DeepEqual(cfg, Default()) {
			t.Errorf("Parse(%q) = %+v, want Default()", data, cfg)
		}
	}
}

func TestSettingsWithoutTablesKeepDefaultTable(t *testing.T) {
	cfg, err := Parse("e.yaml", []byte("server:\n  nats: nats://x:4222\n  user: reprised\n  password: pw\n  inbox_prefix: _R.reprised\n"))
	if err != nil || cfg.Server.User != "reprised" || cfg.Server.Password != "pw" || cfg.Server.InboxPrefix != "_R.reprised" {
		t.Errorf("external user: %+v, %v", cfg.Server, err)
	}
	cfg, err = Parse("s.yaml", []byte(`
server:
  nats: nats://10.0.0.1:4222,nats://10.0.0.2:4222
  creds: user.creds
  prefix: team1.reprise
  metrics: 0.0.0.0:9090
log: {format: json, level: debug}
stream: {replicas: 3, max_bytes: 1e9, max_age: 24h, duplicates: 5m, memory: true}
service: {max_sample_wait: 10s, max_concurrent_samples: 64, pull_bytes: 8_388_608, producer_idle: 0s, standby: true, lease_ttl: 2s, shard: 1/4, sample_priority: 0s, reply_conns: 3}
limits: {max_columns_per_item: 4096, max_reply_bytes: 8e9, max_producer_window: 4096}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.NATS != "nats://10.0.0.1:4222,nats://10.0.0.2:4222" || cfg.Server.Creds != "user.creds" || cfg.Server.Prefix != "team1.reprise" || cfg.Server.Metrics != "0.0.0.0:9090" {
		t.Errorf("server = %+v", cfg.Server)
	}
	if cfg.Server.Embedded() {
		t.Error("Embedded() with nats set")
	}
	if cfg.Log != (Log{Format: "json", Level: "debug"}) {
		t.Errorf("log = %+v", cfg.Log)
	}
	if s := cfg.Stream; s.Replicas != 3 || s.MaxBytes != 1e9 || s.MaxAge != 24*time.Hour || s.Duplicates != 5*time.Minute || !s.Memory {
		t.Errorf("stream = %+v", s)
	}
	if s := cfg.Service; s.MaxSampleWait != 10*time.Second || s.MaxConcurrentSamples != 64 || s.PullBytes != 8<<20 || s.ProducerIdle != 0 || !s.Standby || s.LeaseTTL != 2*time.Second || s.Shard != "1/4" || s.SamplePriority != 0 || s.ReplyConns != 3 {
		t.Errorf("service = %+v", s)
	}
	want := service.DefaultLimits()
	want.MaxColumnsPerItem, want.MaxReplyBytes, want.MaxProducerWindow = 4096, 8e9, 4096
	if cfg.Limits != want {
		t.Errorf("limits = %+v, want %+v", cfg.Limits, want)
	}
	if !reflect.DeepEqual(cfg.Tables, []tables.Config{DefaultTable()}) {
		t.Errorf("tables = %+v, want the default table", cfg.Tables)
	}
}

func TestUsers(t *testing.T) {
	cfg, err := Parse("u.yaml", []byte(`
server:
  listen: 0.0.0.0:4222
  listen_tls_cert: server-cert.pem
  listen_tls_key: server-key.pem
  listen_tls_ca: ca.pem
  listen_tls_verify: true
  users:
    - {name: actor1, role: actor, password: "$2a$11$0123456789012345678901uJx9y1m2Yf5oCvaYpW4x5N4yTqjvF6G"}
    - {nkey: UALJQ2NSA54IU2SHMG5QCRW3ZFYFQX5CP5F4GDSUUG5KCTUTB6LE4FUS, role: learner}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []User{
		{Role: broker.RoleActor, Name: "actor1", Password: "$2a$11$0123456789012345678901uJx9y1m2Yf5oCvaYpW4x5N4yTqjvF6G"},
		{Role: broker.RoleLearner, Nkey: "UALJQ2NSA54IU2SHMG5QCRW3ZFYFQX5CP5F4GDSUUG5KCTUTB6LE4FUS"},
	}
	if !reflect.DeepEqual(cfg.Users, want) {
		t.Errorf("users = %+v, want %+v", cfg.Users, want)
	}
	if s := cfg.Server; s.ListenTLSCert != "server-cert.pem" || s.ListenTLSKey != "server-key.pem" || s.ListenTLSCA != "ca.pem" || !s.ListenTLSVerify || s.AllowUnauthenticated {
		t.Errorf("server = %+v", s)
	}
	if cfg.Users[1].ID() != want[1].Nkey || cfg.Users[0].ID() != "actor1" {
		t.Errorf("IDs %q and %q", cfg.Users[0].ID(), cfg.Users[1].ID())
	}

	cfg, err = Parse("e.yaml", []byte("server:\n  listen: 0.0.0.0:4222\n  allow_unauthenticated: true\n"))
	if err != nil || !cfg.Server.AllowUnauthenticated {
		t.Errorf("allow_unauthenticated: %+v, %v", cfg.Server, err)
	}
}

func TestShorthandsAndPresets(t *testing.T) {
	cfg, err := Parse("t.yaml", []byte(`
defaults: &big {max_size: 5000}
tables:
  - name: stack
    max_size: 10
    rate_limiter: {preset: stack}
  - name: heap
    sampler: {kind: max_heap}
    remover: {kind: min_heap}
    max_size: 1e3
    rate_limiter: {preset: min_size, min_size: 10}
`))
	if err == nil {
		t.Fatalf("an unknown top-level key was accepted: %+v", cfg)
	}
	cfg, err = Parse("t.yaml", []byte(`
tables:
  - name: stack
    max_size: 10
    rate_limiter: {preset: stack}
  - name: heap
    sampler: {kind: max_heap}
    remover: {kind: min_heap}
    max_size: 1e3
    rate_limiter: {preset: min_size, min_size: 10}
  - name: scalar
    max_size: 1
    signature:
      - {name: x, dtype: float64, shape: []}
`))
	if err != nil {
		t.Fatal(err)
	}
	if want := tables.StackConfig("stack", 10); !reflect.DeepEqual(cfg.Tables[0], want) {
		t.Errorf("stack = %+v, want %+v", cfg.Tables[0], want)
	}
	wantHeap := tables.Config{Name: "heap", Sampler: selectors.Options{Kind: selectors.KindMaxHeap}, Remover: selectors.Options{Kind: selectors.KindMinHeap}, MaxSize: 1000, Limiter: limiter.MinSize(10)}
	if !reflect.DeepEqual(cfg.Tables[1], wantHeap) {
		t.Errorf("heap = %+v, want %+v", cfg.Tables[1], wantHeap)
	}
	if got := cfg.Tables[2].Signature; len(got) != 1 || len(got[0].Shape) != 0 || got[0].Shape == nil {
		t.Errorf("scalar signature = %#v, want one column of shape []", got)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		line int
		key  string
		want []string // substrings of the message
	}{
		{"unknown top-level key", "server:\n  prefix: x\nservre: {}\n", 3, "servre", []string{"unknown key", `did you mean "server"`}},
		{"zero limit", "limits:\n  max_columns_per_item: 0\n", 2, "limits.max_columns_per_item", []string{"must be >= 1, got 0"}},
		{"reply below an item", "limits:\n  max_reply_bytes: 1000000\n", 2, "limits.max_reply_bytes", []string{"max_reply_bytes 1000000 is below limits.max_item_bytes 268435456", "never be sampled"}},
		{"item above a reply", "limits:\n  max_item_bytes: 4e9\n", 2, "limits.max_item_bytes", []string{"max_reply_bytes 2147483648 is below limits.max_item_bytes 4000000000"}},
		{"window over the wire's", "limits:\n  max_producer_window: 100000\n", 2, "limits.max_producer_window", []string{"WithMaxInFlight"}},
		{"unknown table key", "tables:\n  - name: t\n    max_size: 10\n    samplr: uniform\n", 4, "tables[0].samplr", []string{`did you mean "sampler"`, "max_times_sampled"}},
		{"unknown key without suggestion", "log:\n  colour: red\n", 2, "log.colour", []string{"unknown key", "format, level"}},
		{"bad sampler kind", "tables:\n  - name: t\n    max_size: 10\n    sampler: unifrom\n", 4, "tables[0].sampler", []string{`unknown selector kind "unifrom"`, `did you mean "uniform"`}},
		{"bad remover kind in mapping", "tables:\n  - name: t\n    max_size: 10\n    remover: {kind: random}\n", 4, "tables[0].remover.kind", []string{`unknown selector kind "random"`, "max_heap"}},
		{"negative max size", "tables:\n  - name: t\n    max_size: -5\n", 3, "tables[0].max_size", []string{"must be >= 1, got -5", "the most items the table holds"}},
		{"max size beyond int32", "tables:\n  - name: t\n    max_size: 3000000000\n", 3, "tables[0].max_size", []string{"must be <= 2147483647, got 3000000000"}},
		{"max size beyond int64", "tables:\n  - name: t\n    max_size: 9223372036854775808\n", 3, "tables[0].max_size", []string{"must be <= 2147483647"}},
		{"max bytes of 2^63 written as a float", "stream:\n  max_bytes: 9223372036854775808.0\n", 2, "stream.max_bytes", []string{"must be <= 9223372036854775807, got 9223372036854775808.0"}},
		{"shape size of 2^63 written as a float", "tables:\n  - name: t\n    max_size: 10\n    signature:\n      - {name: obs, dtype: float32, shape: [9.223372036854775807e18]}\n", 5, "tables[0].signature[0].shape[0]", []string{"must be <= 9223372036854775807"}},
		{"limit beyond int32", "limits:\n  max_producers: 1e10\n", 2, "limits.max_producers", []string{"must be <= 2147483647"}},
		{"max age under JetStream's least", "stream:\n  max_age: 1ms\n", 2, "stream.max_age", []string{"must be 0 or at least 100ms"}},
		{"duplicates under JetStream's least", "stream:\n  duplicates: 50ms\n", 2, "stream.duplicates", []string{"must be 0 or at least 100ms"}},
		{"duplicates over max age", "stream:\n  max_age: 1m\n  duplicates: 10m\n", 3, "stream.duplicates", []string{"longer than stream.max_age"}},
		{"lease ttl under JetStream's least", "service:\n  lease_ttl: 1ms\n", 2, "service.lease_ttl", []string{"must be 0 or at least 100ms"}},
		{"max size with a leading zero", "tables:\n  - name: t\n    max_size: 010\n", 3, "tables[0].max_size", []string{"010 has a leading 0", "0o10"}},
		{"max size with a leading zero, not octal", "tables:\n  - name: t\n    max_size: 09\n", 3, "tables[0].max_size", []string{"09 has a leading 0"}},
		{"negative shape size with a leading zero", "tables:\n  - name: t\n    max_size: 10\n    signature:\n      - {name: obs, dtype: float32, shape: [-01]}\n", 5, "tables[0].signature[0].shape[0]", []string{"-01 has a leading 0"}},
		{"ratio with a leading zero", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter: {preset: custom, samples_per_insert: 010, min_size: 1, min_diff: -.inf, max_diff: .inf}\n", 4, "tables[0].rate_limiter.samples_per_insert", []string{"010 has a leading 0"}},
		{"fractional max size", "tables:\n  - name: t\n    max_size: 1.5\n", 3, "tables[0].max_size", []string{"want a whole number, got 1.5"}},
		{"max size not a number", "tables:\n  - name: t\n    max_size: lots\n", 3, "tables[0].max_size", []string{`want a whole number, got "lots"`}},
		{"max size mapping", "tables:\n  - name: t\n    max_size: {a: 1}\n", 3, "tables[0].max_size", []string{"want a whole number, got a mapping"}},
		{"missing max size", "tables:\n  - name: t\n", 2, "tables[0]", []string{"no max_size"}},
		{"missing name", "tables:\n  - max_size: 3\n", 2, "tables[0]", []string{"no name"}},
		{"max times sampled beyond int32", "tables:\n  - name: t\n    max_size: 3\n    max_times_sampled: -2147483649\n", 4, "tables[0].max_times_sampled", []string{"below 1 for unlimited"}},
		{"ratio error buffer too small", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter:\n      preset: sample_to_insert_ratio\n      samples_per_insert: 4\n      min_size: 10\n      error_buffer: 1\n", 5, "tables[0].rate_limiter", []string{"error buffer 1 is too small"}},
		{"ratio missing parameter", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter: {preset: sample_to_insert_ratio, samples_per_insert: 2, min_size: 5}\n", 4, "tables[0].rate_limiter", []string{"needs error_buffer"}},
		{"parameter of another preset", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter:\n      preset: min_size\n      min_size: 3\n      max_diff: 10\n", 7, "tables[0].rate_limiter.max_diff", []string{"not a parameter of preset min_size", "use preset custom"}},
		{"queue with parameters", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter:\n      preset: queue\n      min_size: 3\n", 6, "tables[0].rate_limiter.min_size", []string{"takes no parameters", "max_size"}},
		{"no preset", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter: {min_size: 3}\n", 4, "tables[0].rate_limiter", []string{"no preset"}},
		{"unknown preset", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter: {preset: ratio}\n", 4, "tables[0].rate_limiter.preset", []string{`unknown rate limiter preset "ratio"`}},
		{"zero samples per insert", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter: {preset: custom, samples_per_insert: 0, min_size: 1, min_diff: 0, max_diff: 10}\n", 4, "tables[0].rate_limiter.samples_per_insert", []string{"must be > 0"}},
		{"custom that deadlocks", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter:\n      preset: custom\n      samples_per_insert: 1\n      min_size: 5\n      min_diff: 10\n      max_diff: 20\n", 5, "tables[0].rate_limiter", []string{"min_diff (10) > samples_per_insert*min_size (5)"}},
		{"min size zero", "tables:\n  - name: t\n    max_size: 10\n    rate_limiter: {preset: min_size, min_size: 0}\n", 4, "tables[0].rate_limiter.min_size", []string{"must be >= 1, got 0"}},
		{"queue with uniform sampler", "tables:\n  - name: q\n    max_size: 10\n    sampler: uniform\n    rate_limiter: {preset: queue}\n", 4, "tables[0].sampler", []string{"a queue samples fifo, not uniform", "use preset custom"}},
		{"stack sampled twice", "tables:\n  - name: s\n    max_size: 10\n    max_times_sampled: 2\n    rate_limiter: {preset: stack}\n", 4, "tables[0].max_times_sampled", []string{"a stack samples each item once"}},
		{"prioritized without exponent", "tables:\n  - name: t\n    max_size: 10\n    sampler: prioritized\n", 4, "tables[0].sampler", []string{"needs an exponent", "exponent: 0.6"}},
		{"exponent on uniform", "tables:\n  - name: t\n    max_size: 10\n    sampler: {kind: uniform, exponent: 1}\n", 4, "tables[0].sampler.exponent", []string{"only prioritized takes an exponent"}},
		{"negative exponent", "tables:\n  - name: t\n    max_size: 10\n    sampler: {kind: prioritized, exponent: -1}\n", 4, "tables[0].sampler.exponent", []string{"must be >= 0"}},
		{"duplicate table", "tables:\n  - name: t\n    max_size: 10\n  - name: t\n    max_size: 20\n", 4, "tables[1].name", []string{`table "t" is already defined at line 2`}},
		{"empty tables", "tables: []\n", 1, "tables", []string{"the list is empty", "default table"}},
		{"tables not a list", "tables:\n  name: t\n", 2, "tables", []string{"want a list of tables"}},
		{"empty signature", "tables:\n  - name: t\n    max_size: 10\n    signature: []\n", 4, "tables[0].signature", []string{"the list is empty", "remove signature"}},
		{"bad dtype", "tables:\n  - name: t\n    max_size: 10\n    signature:\n      - {name: obs, dtype: flaot32, shape: [3]}\n", 5, "tables[0].signature[0].dtype", []string{`unknown dtype "flaot32"`}},
		{"bad shape", "tables:\n  - name: t\n    max_size: 10\n    signature:\n      - {name: obs, dtype: float32, shape: [3, -2]}\n", 5, "tables[0].signature[0].shape[1]", []string{"-1 matches any size"}},
		{"missing shape", "tables:\n  - name: t\n    max_size: 10\n    signature:\n      - {name: obs, dtype: float32}\n", 5, "tables[0].signature[0]", []string{"no shape", "shape: [] for a scalar"}},
		{"repeated key", "log:\n  level: info\n  level: debug\n", 3, "log.level", []string{"set twice (first at line 2)"}},
		{"bad log level", "log:\n  level: verbose\n", 2, "log.level", []string{`unknown log level "verbose"`}},
		{"bad listen", "server:\n  listen: localhost\n", 2, "server.listen", []string{"not HOST:PORT"}},
		{"bad prefix", "server:\n  prefix: a..b\n", 2, "server.prefix", []string{"not a subject prefix"}},
		{"external with embedded setting", "server:\n  nats: nats://x:4222\n  store: ./data\n", 3, "server.store", []string{"configures the embedded server", "remove one of them"}},
		{"credentials without external", "server:\n  creds: a.creds\n", 2, "server.creds", []string{"set server.nats too"}},
		{"cert without key", "server:\n  nats: nats://x:4222\n  tls_cert: c.pem\n", 3, "server.tls_cert", []string{"needs both tls_cert and tls_key"}},
		{"max payload too large", "server:\n  max_payload: 1e9\n", 2, "server.max_payload", []string{"must be in [1024, 33488896], got 1e9"}},
		{"password without external", "server:\n  user: reprised\n  password: pw\n", 2, "server.user", []string{"set server.nats too"}},
		{"users with external", "server:\n  nats: nats://x:4222\n  users:\n    - {name: a, role: actor, password: p}\n", 4, "server.users", []string{"configures the embedded server"}},
		{"user without role", "server:\n  users:\n    - {name: a, password: p}\n", 3, "server.users[0]", []string{"no role", "actor, learner, admin, service"}},
		{"user with unknown role", "server:\n  users:\n    - {name: a, password: p, role: actr}\n", 3, "server.users[0].role", []string{`unknown role "actr"`, `did you mean "actor"`}},
		{"user without password", "server:\n  users:\n    - {name: a, role: actor}\n", 3, "server.users[0]", []string{`user "a" has no password`}},
		{"user with a dotted name", "server:\n  users:\n    - {name: a.b, role: actor, password: p}\n", 3, "server.users[0]", []string{"without dots"}},
		{"user with name and nkey", "server:\n  users:\n    - {name: a, password: p, nkey: UABC, role: actor}\n", 3, "server.users[0]", []string{"not both"}},
		{"user with a seed as nkey", "server:\n  users:\n    - {nkey: SUAB, role: actor}\n", 3, "server.users[0]", []string{"this is an nkey seed"}},
		{"user with a bad nkey", "server:\n  users:\n    - {nkey: UAB, role: actor}\n", 3, "server.users[0]", []string{`"UAB" is not the public key of a user nkey`}},
		{"password without user", "server:\n  nats: nats://h:4222\n  password: pw\n", 3, "server.password", []string{"a password needs server.user"}},
		{"two ways to authenticate", "server:\n  nats: nats://h:4222\n  creds: a.creds\n  nkey: a.nk\n", 3, "server.creds", []string{"server.nkey and server.creds are different ways"}},
		{"inbox prefix with a wildcard", "server:\n  nats: nats://h:4222\n  inbox_prefix: a.*\n", 3, "server.inbox_prefix", []string{"without wildcards"}},
		{"user defined twice", "server:\n  users:\n    - {name: a, role: actor, password: p}\n    - {name: a, role: admin, password: q}\n", 4, "server.users[1]", []string{"user a is already defined at line 3"}},
		{"users empty", "server:\n  users: []\n", 2, "server.users", []string{"the list is empty"}},
		{"users unknown key", "server:\n  users:\n    - {user: a, role: actor, password: p}\n", 3, "server.users[0].user", []string{"unknown key", "role, name, password, nkey"}},
		{"listen TLS cert without key", "server:\n  listen_tls_cert: c.pem\n", 2, "server.listen_tls_cert", []string{"needs both listen_tls_cert and listen_tls_key"}},
		{"listen TLS CA without verify", "server:\n  listen_tls_cert: c.pem\n  listen_tls_key: k.pem\n  listen_tls_ca: ca.pem\n", 4, "server.listen_tls_ca", []string{"set listen_tls_verify: true"}},
		{"listen TLS verify without TLS", "server:\n  listen_tls_verify: true\n", 2, "server.listen_tls_verify", []string{"needs TLS"}},
		{"bad duration", "stream:\n  max_age: 3 days\n", 2, "stream.max_age", []string{"want a duration such as 30s"}},
		{"duration without unit", "service:\n  producer_idle: 30\n", 2, "service.producer_idle", []string{"want a duration"}},
		{"negative sample priority", "service:\n  sample_priority: -1ms\n", 2, "service.sample_priority", []string{"must be >= 0"}},
		{"too many reply connections", "service:\n  reply_conns: 65\n", 2, "service.reply_conns", []string{"65", "0: by the cores"}},
		{"zero sample wait", "service:\n  max_sample_wait: 0s\n", 2, "service.max_sample_wait", []string{"must be > 0"}},
		{"yes is not a boolean", "stream:\n  memory: yes\n", 2, "stream.memory", []string{"want true or false"}},
		{"bad replicas", "stream:\n  replicas: 7\n", 2, "stream.replicas", []string{"1, 3 or 5"}},
		{"shard past its count", "service:\n  shard: 4/4\n", 2, "service.shard", []string{"shard 4/4", "index from 0 to count-1"}},
		{"shard not a fraction", "service:\n  shard: 2\n", 2, "service.shard", []string{`shard "2"`, "INDEX/COUNT"}},
		{"section not a mapping", "server: nats://x\n", 1, "server", []string{"want a mapping with keys nats"}},
		{"merge key", "tables:\n  - &t {name: t, max_size: 3}\n  - {<<: *t, name: u}\n", 3, "tables[1].<<", []string{"merge keys are not supported", "write the keys out"}},
		{"binary string", "server:\n  prefix: !!binary cmVwcmlzZQ==\n", 2, "server.prefix", []string{"tag !!binary is not supported"}},
		{"tag of its own", "tables:\n  - name: !env TABLE\n    max_size: 10\n", 2, "tables[0].name", []string{"tag !env is not supported"}},
		{"second document", "log: {level: info}\n---\nlog: {level: debug}\n", 2, "", []string{"a second YAML document"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("no error for:\n%s", tt.yaml)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not match ErrInvalid", err)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *config.Error", err)
			}
			if ce.Line != tt.line || ce.Key != tt.key {
				t.Errorf("error at line %d key %q, want line %d key %q: %v", ce.Line, ce.Key, tt.line, tt.key, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "bad.yaml:") {
				t.Errorf("message %q does not start with the file name", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestSyntaxError(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		line int
		want string
	}{
		{"key indented too far", "server:\n  listen: 127.0.0.1:4222\n   store: x\n", 3, "indentation"},
		{"key of a table indented too little", "server:\n  prefix: x\ntables:\n  - name: t\n    max_size: 3\n   sampler: fifo\n", 6, "indentation"},
		{"key of a table at the list's indentation", "server:\n  prefix: x\ntables:\n  - name: t\n    max_size: 3\n  sampler: fifo\n", 6, "indentation"},
		{"key indented too little", "server:\n  prefix: x\n  listen: 127.0.0.1:4222\n listen: y\n", 4, "indentation"},
		{"flow mapping left open", "server:\n  prefix: x\nlog: {level: info\nstream: {}\n", 3, "','"},
		{"flow mapping over lines never closed", "log: {level: info,\n  format: text\nstream: []\n", 1, "','"},
		{"after a flow mapping over lines", "log: {level: info,\n  format: text}\nserver:\n  prefix: x\n   listen: y\n", 5, "indentation"},
		{"quote left open", "log:\n  level: info\nserver:\n  prefix: \"x\n", 4, "end of stream"},
		{"tab at the start", "log:\n\tlevel: info\n", 2, "indented with a tab"},
		{"tab after spaces", "server:\n  prefix: x\nlog:\n  level: info\n  \tformat: text\n", 5, "indented with a tab"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("syntax.yaml", []byte(tt.yaml))
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want a *config.Error matching ErrInvalid", err)
			}
			if ce.Line != tt.line {
				t.Errorf("syntax error at line %d, want %d: %v", ce.Line, tt.line, err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, fmt.Sprintf("syntax.yaml:%d: ", tt.line)) || !strings.Contains(msg, tt.want) {
				t.Errorf("message %q should name the file, line %d and say %q", msg, tt.line, tt.want)
			}
		})
	}
}

func TestEveryErrorReported(t *testing.T) {
	_, err := Parse("many.yaml", []byte("log:\n  level: loud\ntables:\n  - name: a\n    max_size: -1\n  - name: b\n    max_size: 1\n    sampler: random\n"))
	var lines []int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *Error
		if errors.As(e, &ce) {
			lines = append(lines, ce.Line)
		}
	}
	if !reflect.DeepEqual(lines, []int{2, 5, 8}) {
		t.Errorf("errors at lines %v, want [2 5 8]: %v", lines, err)
	}
}

func TestLimiterErrorMatchesSentinel(t *testing.T) {
	_, err := Parse("l.yaml", []byte("tables:\n  - name: t\n    max_size: 10\n    rate_limiter: {preset: sample_to_insert_ratio, samples_per_insert: 1, min_size: 1, error_buffer: 0.1}\n"))
	if !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Errorf("got %v, want an error matching limiter.ErrInvalidConfig", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load("does-not-exist.yaml")
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("got %v, want a not-exist error", err)
	}
}

func TestCheckers(t *testing.T) {
	for _, s := range []string{"127.0.0.1:4222", "0.0.0.0:0", "127.0.0.1:-1", "[::1]:4222", "localhost:4222"} {
		if err := CheckListen(s); err != nil {
			t.Errorf("CheckListen(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "4222", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:-2"} {
		if err := CheckListen(s); err == nil {
			t.Errorf("CheckListen(%q) accepted", s)
		}
	}
	if err := CheckMetrics("127.0.0.1:-1"); err == nil {
		t.Error("CheckMetrics accepted port -1")
	}
	for _, s := range []string{"reprise", "a.b-c.d_e"} {
		if err := CheckPrefix(s); err != nil {
			t.Errorf("CheckPrefix(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "a.", ".a", "a b", "a.*", "a.>"} {
		if err := CheckPrefix(s); err == nil {
			t.Errorf("CheckPrefix(%q) accepted", s)
		}
	}
}

// TestNegativeMaxTimesSampled accepts what Reverb accepts: any
// max_times_sampled below 1 means unlimited.
func TestNegativeMaxTimesSampled(t *testing.T) {
	cfg, err := Parse("t.yaml", []byte("tables:\n  - name: t\n    max_size: 3\n    max_times_sampled: -1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Tables[0].MaxTimesSampled; got != -1 {
		t.Fatalf("max_times_sampled = %d, want -1", got)
	}
}

// TestNumberSpellings accepts the spellings of a number YAML 1.1 and 1.2
// read alike.
func TestNumberSpellings(t *testing.T) {
	for _, tt := range []struct {
		yaml string
		want int64
	}{
		{"0", 0}, {"+0", 0}, {"10", 10}, {"+10", 10}, {"1_000", 1000}, {"0o10", 8}, {"0x10", 16}, {"1e3", 1000}, {"10.0", 10}, {"0.0", 0},
	} {
		cfg, err := Parse("n.yaml", []byte("stream:\n  max_bytes: "+tt.yaml+"\n"))
		if err != nil {
			t.Errorf("max_bytes: %s: %v", tt.yaml, err)
			continue
		}
		if cfg.Stream.MaxBytes != tt.want {
			t.Errorf("max_bytes: %s = %d, want %d", tt.yaml, cfg.Stream.MaxBytes, tt.want)
		}
	}
}
