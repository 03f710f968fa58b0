package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
	"github.com/reprise-rl/reprise/cmd/internal/daemon"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/internal/load"
	"github.com/reprise-rl/reprise/internal/natstest"
	"github.com/reprise-rl/reprise/internal/syncbuf"
	"github.com/reprise-rl/reprise/limiter"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var urlLine = regexp.MustCompile(`NATS URL:\s+(\S+)`)

// startReprised runs reprised in process until the test ends and returns
// the URL clients connect to.
func startReprised(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, args, stdout, stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("reprised: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("reprised did not stop within 30s")
		}
	})
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(stdout.String(), "Stop it with Ctrl-C.") {
		if time.Now().After(deadline) {
			t.Fatalf("reprised not ready:\n%s\n%s", stdout.String(), stderr.String())
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("reprised exited: %v\n%s", err, stderr.String())
		case <-tick.C:
		}
	}
	return urlLine.FindStringSubmatch(stdout.String())[1]
}

func embedded(t *testing.T, prefix string) string {
	return startReprised(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir(), "--prefix", prefix, "--log-level", "warn")
}

func insert(t *testing.T, url, prefix, table string, n int) {
	t.Helper()
	ctx := testCtx(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := p.Append(ctx, broker.Step{"x": broker.Float32s([]int64{4}, []float32{float32(i), 0, 0, 0})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, table, 1, broker.LastStep("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// ctl runs reprisectl with args and returns its stdout, stderr and error.
func ctl(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := Run(testCtx(t), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestInfoAndReset(t *testing.T) {
	url := embedded(t, "ctl.info")
	insert(t, url, "ctl.info", "replay", 7)
	common := []string{"--nats", url, "--prefix", "ctl.info"}

	out, _, err := ctl(t, append([]string{"info"}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	header := regexp.MustCompile(`(?m)^TABLE\s+SIZE\s+MAX SIZE\s+SAMPLER\s+REMOVER\s+MAX SAMPLED\s+RATE LIMITER\s+INSERTS\s+SAMPLES`)
	row := regexp.MustCompile(`(?m)^replay\s+7\s+1000000\s+uniform\s+fifo\s+unlimited\s+min_size\(1\)\s+7\s+0\s+0\s+0\s+\d+ B\s+0\s+0$`)
	if !header.MatchString(out) || !row.MatchString(out) {
		t.Errorf("info output lacks the header or the replay row:\n%s", out)
	}
	if !strings.Contains(out, "prefix ctl.info") {
		t.Errorf("info output does not name the prefix:\n%s", out)
	}

	out, _, err = ctl(t, append([]string{"info", "--json"}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		URL             string `json:"url"`
		Prefix          string `json:"prefix"`
		AppliedSequence uint64 `json:"applied_sequence"`
		Chunks          int64  `json:"chunks"`
		Tables          []struct {
			Name        string `json:"name"`
			Size        int64  `json:"size"`
			MaxSize     int64  `json:"max_size"`
			Sampler     string `json:"sampler"`
			Inserts     int64  `json:"inserts"`
			BytesHeld   int64  `json:"bytes_held"`
			RateLimiter struct {
				Preset string         `json:"preset"`
				Config limiter.Config `json:"config"`
			} `json:"rate_limiter"`
		} `json:"tables"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("info --json is not JSON: %v\n%s", err, out)
	}
	if rep.URL != url || rep.Prefix != "ctl.info" || rep.AppliedSequence == 0 || rep.Chunks == 0 || len(rep.Tables) != 1 {
		t.Fatalf("info --json = %+v", rep)
	}
	tb := rep.Tables[0]
	if tb.Name != "replay" || tb.Size != 7 || tb.MaxSize != 1000000 || tb.Sampler != "uniform" || tb.Inserts != 7 || tb.BytesHeld == 0 ||
		tb.RateLimiter.Preset != "min_size(1)" || tb.RateLimiter.Config != limiter.MinSize(1) {
		t.Errorf("replay in info --json = %+v", tb)
	}

	// One table by name; an unknown one lists what there is.
	if _, _, err := ctl(t, append([]string{"info", "replay"}, common...)...); err != nil {
		t.Errorf("info replay: %v", err)
	}
	_, _, err = ctl(t, append([]string{"info", "nope"}, common...)...)
	if !errors.Is(err, broker.ErrUnknownTable) || !strings.Contains(err.Error(), "replay") || !strings.Contains(err.Error(), "reprisectl info lists the tables") {
		t.Errorf("info of an unknown table: %v", err)
	}

	// Flags after the table name work too.
	out, _, err = ctl(t, "reset", "replay", "--nats", url, "--prefix", "ctl.info")
	if err != nil || out != "reset table replay\n" {
		t.Fatalf("reset replay = %q, %v", out, err)
	}
	out, _, err = ctl(t, append([]string{"info", "--json", "replay"}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Tables[0].Size != 0 || rep.Tables[0].Inserts != 7 {
		t.Errorf("after reset: %+v, %v; want size 0 and the lifetime count of inserts kept", rep.Tables, err)
	}
	out, _, err = ctl(t, append([]string{"reset", "--all"}, common...)...)
	if err != nil || out != "reset every table\n" {
		t.Errorf("reset --all = %q, %v", out, err)
	}
	if _, _, err := ctl(t, append([]string{"reset", "nope"}, common...)...); !errors.Is(err, broker.ErrUnknownTable) {
		t.Errorf("reset of an unknown table: %v", err)
	}
}

// TestServiceFailureIsNotNoService: a table service that answers with a
// failure (here its checkpoint directory became a file) is reported as
// having answered, with its reason. reprisectl used to say that no service
// answered, and to start one.
func TestServiceFailureIsNotNoService(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "checkpoints")
	url := startReprised(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir(), "--prefix", "ctl.cpf", "--log-level", "error", "--checkpoint-dir", dir, "--checkpoint-every", "0s")
	insert(t, url, "ctl.cpf", "replay", 3)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Before reprised stops, so that its last checkpoint has a place.
	t.Cleanup(func() { os.Remove(dir); os.Mkdir(dir, 0o755) })
	_, _, err := ctl(t, "checkpoint", "--nats", url, "--prefix", "ctl.cpf")
	if err == nil || !strings.Contains(err.Error(), `the table service on prefix "ctl.cpf" answered`) || !strings.Contains(err.Error(), "not a directory") || strings.Contains(err.Error(), "Start one") {
		t.Fatalf("checkpoint into a file: %v, want the service's answer", err)
	}
}

func TestNoService(t *testing.T) {
	srv, err := embeddednats.Start(testCtx(t), embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithListen("127.0.0.1:-1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	_, _, err = ctl(t, "info", "--nats", srv.ClientURL(), "--prefix", "nobody", "--timeout", "2s")
	if err == nil {
		t.Fatal("info succeeded without a table service")
	}
	msg := err.Error()
	for _, want := range []string{`no table service answered on prefix "nobody" at ` + srv.ClientURL(), "go run ./cmd/reprised", "--prefix"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	_, _, err = ctl(t, "bench", "--nats", srv.ClientURL(), "--prefix", "nobody", "--timeout", "2s")
	if err == nil || !strings.Contains(err.Error(), "no table service answered") {
		t.Errorf("bench without a table service: %v", err)
	}
	_, _, err = ctl(t, "bench", "--nats", srv.ClientURL(), "--prefix", "nobody0", "--prefix", "nobody1", "--timeout", "2s")
	if err == nil || !strings.Contains(err.Error(), `a shard's table service did not answer (prefixes ["nobody0" "nobody1"]`) || !strings.Contains(err.Error(), "--shard INDEX/COUNT") {
		t.Errorf("sharded bench without table services: %v", err)
	}
}

func TestNoServer(t *testing.T) {
	var stderr bytes.Buffer
	code := Main(testCtx(t), []string{"info", "--nats", "nats://127.0.0.1:1"}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "connecting to NATS at nats://127.0.0.1:1") {
		t.Errorf("exit status %d, stderr %q: want 1 and the URL it could not reach", code, stderr.String())
	}
}

// benchJSON is the part of bench --json the tests read.
type benchJSON struct {
	Mode         string  `json:"mode"`
	PayloadBytes int     `json:"payload_bytes"`
	Items        int64   `json:"items"`
	ItemsPerSec  float64 `json:"items_per_sec"`
	BytesPerSec  float64 `json:"bytes_per_sec"`
	DurationSec  float64 `json:"duration_sec"`
	Latency      struct {
		Count int64   `json:"count"`
		P50   float64 `json:"p50_ms"`
		P90   float64 `json:"p90_ms"`
		P99   float64 `json:"p99_ms"`
		Max   float64 `json:"max_ms"`
	} `json:"latency"`
	Insert *struct {
		Items       int64   `json:"items"`
		ItemsPerSec float64 `json:"items_per_sec"`
	} `json:"insert"`
	Sample *struct {
		Items           int64  `json:"items"`
		LatencyMeasures string `json:"latency_measures"`
		Latency         struct {
			Count int64 `json:"count"`
		} `json:"latency"`
	} `json:"sample"`
	Learners    int      `json:"learners"`
	SampleBatch int      `json:"sample_batch"`
	InFlight    int      `json:"in_flight"`
	Shards      int      `json:"shards"`
	Sharded     bool     `json:"sharded"`
	Prefixes    []string `json:"prefixes"`
	Episode     int      `json:"episode"`
}

func runBenchJSON(t *testing.T, url, prefix string, args ...string) benchJSON {
	t.Helper()
	args = append([]string{"bench", "--json", "--nats", url, "--prefix", prefix, "--clients", "2", "--payload", "64", "--batch", "8", "--duration", "1s", "--warmup", "200ms"}, args...)
	out, stderr, err := ctl(t, args...)
	if err != nil {
		t.Fatalf("%q: %v\nstderr:\n%s", args, err, stderr)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("bench --json output is not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"items_per_sec", "bytes_per_sec", "latency", "mode", "table", "clients", "batch", "duration_sec"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("bench --json lacks %q:\n%s", k, out)
		}
	}
	var b benchJSON
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if b.ItemsPerSec <= 0 || b.BytesPerSec <= 0 || b.Items <= 0 || b.Latency.Count <= 0 {
		t.Errorf("bench measured nothing: %s", out)
	}
	if !(b.Latency.P50 > 0 && b.Latency.P50 <= b.Latency.P90 && b.Latency.P90 <= b.Latency.P99 && b.Latency.P99 <= b.Latency.Max) {
		t.Errorf("latency percentiles out of order: %+v", b.Latency)
	}
	if math.Abs(b.DurationSec-1) > 0.01 {
		t.Errorf("measured %vs, want the 1s asked for", b.DurationSec)
	}
	// Progress lines go to stderr.
	if !strings.Contains(stderr, "items/s") {
		t.Errorf("no progress on stderr:\n%s", stderr)
	}
	return b
}

func TestBench(t *testing.T) {
	url := embedded(t, "ctl.bench")
	ins := runBenchJSON(t, url, "ctl.bench")
	if ins.Mode != "insert" || ins.Insert == nil || ins.Sample != nil || ins.Insert.Items != ins.Items || ins.PayloadBytes != 64 {
		t.Errorf("default mode: %+v, want insert only", ins)
	}
	if ins.Shards != 1 || ins.Sharded || ins.Prefixes != nil || ins.Episode != 0 {
		t.Errorf("one --prefix: %+v, want 1 shard, plain clients, one episode per inserter", ins)
	}
	smp := runBenchJSON(t, url, "ctl.bench", "--mode", "sample")
	if smp.Sample == nil || smp.Insert != nil {
		t.Errorf("sample mode: %+v", smp)
	}
	mix := runBenchJSON(t, url, "ctl.bench", "--mode", "mixed")
	if mix.Insert == nil || mix.Sample == nil || mix.Insert.Items <= 0 || mix.Sample.Items <= 0 || mix.Items != mix.Insert.Items+mix.Sample.Items {
		t.Errorf("mixed mode: %+v", mix)
	}
	// Learners ask for their own batch: every request of 3 items, where
	// the inserters flush 8.
	mix = runBenchJSON(t, url, "ctl.bench", "--mode", "mixed", "--learners", "3", "--sample-batch", "3")
	if mix.Sample == nil || mix.Learners != 3 || mix.SampleBatch != 3 || mix.Sample.Latency.Count <= 0 || mix.Sample.Items != 3*mix.Sample.Latency.Count {
		t.Errorf("mixed mode with --learners 3 --sample-batch 3: %+v", mix)
	}
	if _, _, err := ctl(t, "bench", "--nats", url, "--prefix", "ctl.bench", "--learners", "2"); err == nil {
		t.Error("--learners in insert mode: no error")
	}
	// Prefetching learners: each batch of 5 comes whole, from a Sampler.
	pre := runBenchJSON(t, url, "ctl.bench", "--mode", "sample", "--in-flight", "3", "--batch", "5")
	if pre.Sample == nil || pre.InFlight != 3 || pre.Sample.Latency.Count <= 0 || pre.Sample.Items != 5*pre.Sample.Latency.Count ||
		!strings.Contains(pre.Sample.LatencyMeasures, "3 requests open") {
		t.Errorf("sample mode with --in-flight 3: %+v", pre)
	}
	if _, _, err := ctl(t, "bench", "--nats", url, "--prefix", "ctl.bench", "--in-flight", "2"); err == nil {
		t.Error("--in-flight in insert mode: no error")
	}

	out, _, err := ctl(t, "bench", "--nats", url, "--prefix", "ctl.bench", "--clients", "1", "--payload", "16", "--batch", "4", "--duration", "300ms", "--warmup", "0s")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bench insert: table replay", "items/s", "p50", "p99", "max", "reprisectl reset replay"} {
		if !strings.Contains(out, want) {
			t.Errorf("readable output lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchEmptyTable(t *testing.T) {
	url := embedded(t, "ctl.empty")
	_, _, err := ctl(t, "bench", "--mode", "sample", "--nats", url, "--prefix", "ctl.empty")
	if err == nil || !strings.Contains(err.Error(), `table "replay" is empty`) || !strings.Contains(err.Error(), "--mode mixed") {
		t.Errorf("sample bench of an empty table: %v", err)
	}
	_, _, err = ctl(t, "bench", "--table", "nope", "--nats", url, "--prefix", "ctl.empty")
	if !errors.Is(err, broker.ErrUnknownTable) {
		t.Errorf("bench of an unknown table: %v", err)
	}
}

func TestExternalServer(t *testing.T) {
	srv := natstest.Start(t)
	startReprised(t, "--nats", srv.URL(), "--prefix", "ctl.ext", "--log-level", "warn")
	insert(t, srv.URL(), "ctl.ext", "replay", 3)
	out, _, err := ctl(t, "info", "--nats", srv.URL(), "--prefix", "ctl.ext")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^replay\s+3\s`).MatchString(out) {
		t.Errorf("info against the external server:\n%s", out)
	}
	b := runBenchJSON(t, srv.URL(), "ctl.ext", "--mode", "mixed")
	if b.Insert == nil || b.Sample == nil {
		t.Errorf("mixed bench against the external server: %+v", b)
	}
}

// TestBenchSharded: bench over a table of two shards, two reprised on one
// nats-server. The inserters' episodes go to the shards in turn, samples
// come from both, and prefixes that do not name the shards in order are
// refused before the run.
func TestBenchSharded(t *testing.T) {
	srv := natstest.Start(t)
	url := srv.URL()
	prefixes := []string{"ctl.s0", "ctl.s1"}
	for i, p := range prefixes {
		startReprised(t, "--nats", url, "--prefix", p, "--shard", fmt.Sprintf("%d/2", i), "--log-level", "warn")
	}
	// runBenchJSON gives the first --prefix, and 2 clients with batches
	// of 8.
	const clients, batch = 2, 8
	ins := runBenchJSON(t, url, prefixes[0], "--prefix", prefixes[1])
	if ins.Shards != 2 || !ins.Sharded || !slices.Equal(ins.Prefixes, prefixes) || ins.Insert == nil || ins.Episode != batch {
		t.Errorf("sharded insert: %+v, want 2 shards %q, inserts, episodes of %d", ins, prefixes, batch)
	}
	ctx := testCtx(t)
	for _, p := range prefixes {
		// Inserts count once stored: wait until each shard applied them.
		if err := load.CaughtUp(ctx, url, p); err != nil {
			t.Fatal(err)
		}
	}
	info := shardedInfo(t, url, prefixes)
	in0, in1 := info.Shards[0].Tables[0].Inserts, info.Shards[1].Tables[0].Inserts
	// Each producer's episodes alternate; its last, cut short by the
	// run's end, goes to either shard.
	if in0 == 0 || in1 == 0 || in0+in1 < ins.Insert.Items || max(in0-in1, in1-in0) > clients*2*batch {
		t.Errorf("shards took %d and %d items of %d measured: want both, in turn (at most %d apart)", in0, in1, ins.Insert.Items, clients*2*batch)
	}

	smp := runBenchJSON(t, url, prefixes[0], "--prefix", prefixes[1], "--mode", "sample")
	if smp.Shards != 2 || smp.Sample == nil || smp.Sample.Items <= 0 {
		t.Errorf("sharded sample: %+v", smp)
	}
	info = shardedInfo(t, url, prefixes)
	for i, s := range info.Shards {
		if s.Tables[0].Samples == 0 {
			t.Errorf("shard %d was never sampled", i)
		}
	}

	// info sums the shards, and shows each.
	out, _, err := ctl(t, "info", "--nats", url, "--prefix", prefixes[0], "--prefix", prefixes[1], "--json", "replay")
	if err != nil {
		t.Fatal(err)
	}
	var rep infoReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("info --json: %v\n%s", err, out)
	}
	if len(rep.Shards) != 2 || rep.Tables[0].Size != rep.Shards[0].Tables[0].Size+rep.Shards[1].Tables[0].Size || rep.Tables[0].Size == 0 {
		t.Errorf("sharded info: %d shards, table size %d; want 2 shards whose sizes add up to it", len(rep.Shards), rep.Tables[0].Size)
	}
	if out, _, err = ctl(t, "info", "--nats", url, "--prefix", prefixes[0], "--prefix", prefixes[1]); err != nil || !strings.Contains(out, "2 shards (prefixes ctl.s0,ctl.s1)") || !strings.Contains(out, "shard 1, prefix ctl.s1") {
		t.Errorf("sharded info: %v\n%s", err, out)
	}

	startReprised(t, "--nats", url, "--prefix", "ctl.whole", "--log-level", "warn")
	for _, tt := range []struct {
		prefixes []string
		want     string
	}{
		{[]string{"ctl.s1", "ctl.s0"}, `--prefix "ctl.s1" is shard 1/2 (reprised --shard) but comes as shard 0/2: give --prefix once per shard, in shard order`},
		{[]string{"ctl.s0"}, `--prefix "ctl.s0" is shard 0/2 (reprised --shard) but comes as shard 0/1`},
		{[]string{"ctl.whole"}, `--prefix "ctl.whole" is not a shard: start its reprised with --shard 0/1`},
	} {
		args := []string{"bench", "--nats", url, "--sharded", "--duration", "1s"}
		for _, p := range tt.prefixes {
			args = append(args, "--prefix", p)
		}
		if _, _, err := ctl(t, args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", args, err, tt.want)
		}
	}
}

// shardedInfo asks each shard of a sharded table what it holds.
func shardedInfo(t *testing.T, url string, prefixes []string) *broker.ShardedInfo {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sc, err := broker.NewShardedClient(nc, prefixes)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	info, err := sc.Info(testCtx(t), "replay")
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"info", "a", "b"}, "at most one table"},
		{[]string{"info", "--prefix", "a..b"}, "not a subject prefix"},
		{[]string{"info", "--timeout", "0s"}, "--timeout must be > 0"},
		{[]string{"info", "--tls-key", "k.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"reset"}, "needs one table name"},
		{[]string{"reset", "a", "--all"}, "not both"},
		{[]string{"bench", "--mode", "both"}, `--mode "both"`},
		{[]string{"bench", "--payload", "6"}, "multiple of 4"},
		{[]string{"bench", "--clients", "0"}, "--clients must be >= 1"},
		{[]string{"bench", "--batch", "0"}, "--batch must be >= 1"},
		{[]string{"bench", "--duration", "0s"}, "--duration must be > 0"},
		{[]string{"bench", "--warmup", "-1s"}, "--warmup must be >= 0"},
		{[]string{"bench", "--compression", "lz4"}, `--compression "lz4"`},
		{[]string{"bench", "replay"}, "the table is --table"},
		{[]string{"bench", "--bogus"}, "flag provided but not defined"},
		{[]string{"bench", "--prefix", "a", "--prefix", "a..b"}, "not a subject prefix"},
		{[]string{"bench", "--prefix", "a", "--prefix", "b", "--prefix", "a"}, `--prefix "a" is given for shards 0 and 2`},
		{[]string{"bench", "--batch", "8", "--episode", "12"}, "--episode must be a multiple of --batch (8), got 12"},
		{[]string{"bench", "--mode", "sample", "--episode", "128"}, "--episode is for inserters"},
	}
	for _, tt := range tests {
		_, _, err := ctl(t, tt.args...)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("reprisectl %q = %v, want a usage error containing %q", tt.args, err, tt.want)
		}
		if code := Main(testCtx(t), tt.args, io.Discard, io.Discard); code != 2 {
			t.Errorf("reprisectl %q exit status %d, want 2", tt.args, code)
		}
	}
}

func TestHelp(t *testing.T) {
	_, stderr, err := ctl(t, "--help")
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr, "info") || !strings.Contains(stderr, "bench") || !strings.Contains(stderr, "reset TABLE") {
		t.Errorf("reprisectl --help = %v:\n%s", err, stderr)
	}
	common := []string{"nats", "prefix", "timeout", "creds", "tls-ca", "tls-cert", "tls-key"}
	for cmd, flags := range map[string][]string{
		"info":  append([]string{"json"}, common...),
		"reset": append([]string{"all"}, common...),
		"bench": append([]string{"mode", "clients", "payload", "batch", "episode", "sharded", "duration", "warmup", "table", "compression", "json"}, common...),
	} {
		for _, args := range [][]string{{cmd, "--help"}, {"help", cmd}} {
			_, stderr, err := ctl(t, args...)
			if !errors.Is(err, flag.ErrHelp) {
				t.Errorf("%q = %v, want flag.ErrHelp", args, err)
			}
			for _, f := range flags {
				if !strings.Contains(stderr, "--"+f+" ") && !strings.Contains(stderr, "--"+f+"\n") {
					t.Errorf("%q does not explain --%s:\n%s", args, f, stderr)
				}
			}
		}
		if code := Main(testCtx(t), []string{cmd, "-h"}, io.Discard, io.Discard); code != 0 {
			t.Errorf("%s -h: exit status %d, want 0", cmd, code)
		}
	}
	_, stderr, _ = ctl(t, "bench", "--help")
	for _, want := range []string{"the batch's first Append until Flush returns", "from sending it until", "--warmup", "--prefix once per shard"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("bench --help does not say %q", want)
		}
	}
}

func TestDescribeLimiter(t *testing.T) {
	ratio, err := limiter.SampleToInsertRatio(4, 1000, 400)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cfg     limiter.Config
		sampler string
		want    string
	}{
		{limiter.MinSize(3), "uniform", "min_size(3)"},
		{limiter.Queue(100), "fifo", "queue(100)"},
		{limiter.Stack(100), "lifo", "stack(100)"},
		{ratio, "uniform", "ratio(spi=4, min_size=1000, error_buffer=400)"},
		{limiter.Config{SamplesPerInsert: 2, MinSize: 100, MinDiff: 0, MaxDiff: math.Inf(1)}, "uniform", "custom(spi=2, min_size=100, min_diff=0, max_diff=inf)"},
	}
	for _, tt := range tests {
		if got := describeLimiter(tt.cfg, tt.sampler); got != tt.want {
			t.Errorf("describeLimiter(%+v) = %q, want %q", tt.cfg, got, tt.want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tt := range []struct {
		b    float64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"}, {3 << 20, "3.0 MiB"}, {5 << 30, "5.0 GiB"}} {
		if got := formatBytes(tt.b); got != tt.want {
			t.Errorf("formatBytes(%v) = %q, want %q", tt.b, got, tt.want)
		}
	}
}

func TestCheckpoint(t *testing.T) {
	url := startReprised(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir(), "--prefix", "ctl.cp", "--log-level", "warn", "--checkpoint-every", "0s")
	insert(t, url, "ctl.cp", "replay", 9)
	out, _, err := ctl(t, "checkpoint", "--json", "--nats", url, "--prefix", "ctl.cp")
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Name    string  `json:"name"`
		Applied uint64  `json:"applied_sequence"`
		Items   int64   `json:"items"`
		Bytes   int64   `json:"bytes"`
		PauseMS float64 `json:"pause_ms"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("checkpoint --json is not JSON: %v\n%s", err, out)
	}
	if res.Items != 9 || res.Applied == 0 || res.Bytes == 0 || !strings.HasPrefix(res.Name, "checkpoint-") {
		t.Fatalf("checkpoint result %+v, want 9 items", res)
	}
	out, _, err = ctl(t, "checkpoint", "--nats", url, "--prefix", "ctl.cp")
	if err != nil || !strings.Contains(out, "9 items") {
		t.Fatalf("checkpoint = %q, %v", out, err)
	}
	if _, _, err := ctl(t, "checkpoint", "extra", "--nats", url); !errors.Is(err, cli.ErrUsage) {
		t.Fatalf("checkpoint with an argument: %v, want a usage error", err)
	}
	// Out of time, it says the checkpoint may go on, not that no service
	// answered; and it waits minutes unless told otherwise.
	_, _, err = ctl(t, "checkpoint", "--nats", url, "--prefix", "ctl.cp", "--timeout", "1ns")
	if err == nil || !strings.Contains(err.Error(), "goes on without this command") || strings.Contains(err.Error(), "Start one") {
		t.Fatalf("checkpoint out of time: %v, want that it goes on", err)
	}
	_, help, _ := ctl(t, "checkpoint", "--help")
	if !strings.Contains(help, "(default 10m0s)") {
		t.Errorf("checkpoint --help does not give a default --timeout of 10m0s:\n%s", help)
	}
}

func TestPermissions(t *testing.T) {
	out, _, err := ctl(t, "permissions", "--prefix", "team.rl")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"authorization {\n  users = [\n",
		"    # actor: publishes inserts",
		`      user: "actor"` + "\n" + `      password: "ACTOR_PASSWORD"`,
		`      user: "learner"`, `      user: "admin"`, `      user: "service"`,
		`"team.rl.data.insert"`, `"$JS.API.STREAM.INFO.REPRISE_TEAM_RL"`, `"_INBOX.actor.>"`,
		"          deny: [\n            \"team.rl.api.>\"\n          ]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("permissions output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "{") != strings.Count(out, "}") || strings.Count(out, "[") != strings.Count(out, "]") {
		t.Errorf("unbalanced braces or brackets:\n%s", out)
	}

	out, _, err = ctl(t, "permissions", "--role", "learner", "--user", "lea")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `user: "lea"`) || !strings.Contains(out, `"_INBOX.lea.>"`) || !strings.Contains(out, `"reprise.api.sample"`) || strings.Contains(out, "actor") {
		t.Errorf("--role learner --user lea:\n%s", out)
	}
	out, _, err = ctl(t, "permissions", "--role", "learner", "--prefix", "s0", "--prefix", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"s0.api.sample"`) || !strings.Contains(out, `"s1.api.sample"`) || strings.Count(out, `"_INBOX.learner.>"`) != 1 || !strings.Contains(out, `prefixes ["s0" "s1"]`) {
		t.Errorf("--prefix s0 --prefix s1:\n%s", out)
	}
	const pub = "UALJQ2NSA54IU2SHMG5QCRW3ZFYFQX5CP5F4GDSUUG5KCTUTB6LE4FUS"
	out, _, err = ctl(t, "permissions", "--role", "actor", "--nkey", pub)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `nkey: "`+pub+`"`) || strings.Contains(out, "password:") || !strings.Contains(out, `"_INBOX.`+pub+`.>"`) {
		t.Errorf("--nkey:\n%s", out)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--role", "observer"}, `unknown role "observer"`},
		{[]string{"--user", "x"}, "add --role"},
		{[]string{"--role", "actor", "--user", "a.b"}, "without dots"},
		{[]string{"--role", "actor", "--user", "a", "--nkey", pub}, "give one"},
		{[]string{"--role", "actor", "--nkey", "SUAB"}, "not the public key"},
		{[]string{"--prefix", "a.>"}, "not a subject prefix"},
		{[]string{"extra"}, "takes no arguments"},
	} {
		_, _, err := ctl(t, append([]string{"permissions"}, tt.args...)...)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("permissions %q: %v, want a usage error containing %q", tt.args, err, tt.want)
		}
	}
}

// TestRoles: against a reprised with users, every command authenticates;
// one the user's role does not allow fails at once, saying so.
func TestRoles(t *testing.T) {
	url := startReprised(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir(), "--prefix", "ctl.roles", "--log-level", "warn",
		"--embedded-user", "learner:lea:lea-pw", "--embedded-user", "admin:ops:ops-pw")
	as := func(user, password string, args ...string) []string {
		return append(args, "--nats", url, "--prefix", "ctl.roles", "--timeout", "1m", "--user", user, "--password", password)
	}
	if out, _, err := ctl(t, as("lea", "lea-pw", "info")...); err != nil || !strings.Contains(out, "replay") {
		t.Errorf("info as a learner = %q, %v", out, err)
	}
	start := time.Now()
	_, _, err := ctl(t, as("lea", "lea-pw", "reset", "replay")...)
	if err == nil || !strings.Contains(err.Error(), "the NATS server refused this user") || !strings.Contains(err.Error(), `"ctl.roles.api.reset"`) {
		t.Errorf("reset as a learner: %v, want a refusal naming the subject", err)
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Errorf("the refusal took %v: it waited for the timeout", waited)
	}
	if _, _, err := ctl(t, as("ops", "ops-pw", "checkpoint")...); err != nil {
		t.Errorf("checkpoint as an admin: %v", err)
	}
	if out, _, err := ctl(t, as("ops", "ops-pw", "reset", "--all")...); err != nil || out != "reset every table\n" {
		t.Errorf("reset as an admin = %q, %v", out, err)
	}
	_, _, err = ctl(t, as("ops", "wrong", "info")...)
	if err == nil || !strings.Contains(err.Error(), "refused these credentials") {
		t.Errorf("a wrong password: %v", err)
	}
	_, _, err = ctl(t, "info", "--nats", url, "--prefix", "ctl.roles")
	if err == nil || !strings.Contains(err.Error(), "requires authentication") {
		t.Errorf("no credentials: %v", err)
	}
}

// TestInfoShowsPolicyVersions: a table with a staleness bound gets a line
// with its current version, its items' versions and the stale drops.
func TestInfoShowsPolicyVersions(t *testing.T) {
	k := int64(2)
	rep := infoReport{Tables: []tableReport{
		{Name: "onpolicy", PolicyVersion: 7, MaxStaleness: &k, MinItemVersion: 5, MaxItemVersion: 7, StaleEvictions: 40},
		{Name: "plain"},
	}}
	var out strings.Builder
	if err := rep.write(&out); err != nil {
		t.Fatal(err)
	}
	if want := "onpolicy: current 7, items of versions 5..7, max_staleness 2, 40 items dropped as stale"; !strings.Contains(out.String(), want) {
		t.Errorf("info output lacks %q:\n%s", want, out.String())
	}
	if strings.Contains(out.String(), "plain: current") {
		t.Errorf("a table without versions got a versions line:\n%s", out.String())
	}
}
