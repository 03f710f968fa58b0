package metrics

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// fakeService holds real tables without a broker around them.
type fakeService struct {
	tables  map[string]*tables.Table
	applied uint64
	pace    float64
}

func (f *fakeService) TableNames() []string { return []string{"a", "b"} }
func (f *fakeService) Table(name string) (*tables.Table, bool) {
	t, ok := f.tables[name]
	return t, ok
}
func (f *fakeService) Applied() uint64     { return f.applied }
func (f *fakeService) InsertPace() float64 { return f.pace }

func newFake(t *testing.T) *fakeService {
	t.Helper()
	store := tables.NewChunkStore()
	f := &fakeService{tables: make(map[string]*tables.Table), applied: 42, pace: 2500}
	for _, name := range []string{"a", "b"} {
		tb, err := tables.New(tables.Config{
			Name:    name,
			Sampler: selectors.Options{Kind: selectors.KindFifo},
			Remover: selectors.Options{Kind: selectors.KindFifo},
			MaxSize: 2,
			Limiter: limiter.MinSize(1),
		}, store)
		if err != nil {
			t.Fatal(err)
		}
		f.tables[name] = tb
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Three inserts into a table of two: one eviction.
	for key := uint64(1); key <= 3; key++ {
		store.Put(&tables.Chunk{Key: key, Format: &tables.Format{DType: "float32", Shape: []int64{2}}, Length: 1, Data: make([]byte, 8)})
		item := tables.Item{Key: key, Priority: 1, Trajectory: []tables.Column{{Name: "obs", Slices: []tables.Slice{{Chunk: key, Length: 1}}}}}
		if err := f.tables["a"].Insert(ctx, item); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.tables["a"].Sample(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return f
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func TestMetrics(t *testing.T) {
	m := New()
	if err := m.Watch(newFake(t)); err != nil {
		t.Fatal(err)
	}
	m.SampleServed("a", 1, 3*time.Millisecond, broker.CodeOK)
	m.SampleServed("a", 0, 2*time.Second, broker.CodeRateLimited)
	m.ItemInserted("a", time.Millisecond)
	m.ItemInserted("b", 5*time.Millisecond)
	m.Rejected("a", broker.CodeInvalidArgument)
	m.Rejected("no such table", broker.CodeNotFound)
	m.Rejected("", broker.CodeInvalidArgument)

	got := scrape(t, m)
	for _, want := range []string{
		`reprise_applied_sequence 42`,
		`reprise_insert_pace_items_per_second 2500`,
		`reprise_table_size{table="a"} 2`,
		`reprise_table_size{table="b"} 0`,
		`reprise_table_max_size{table="a"} 2`,
		`reprise_table_bytes_held{table="a"} 16`,
		`reprise_table_chunks{table="a"} 2`,
		`reprise_table_inserts_total{table="a"} 3`,
		`reprise_table_samples_total{table="a"} 1`,
		`reprise_table_deletes_total{table="a"} 1`,
		`reprise_table_evictions_total{table="a"} 1`,
		`reprise_table_insert_waits_total{table="a"} 0`,
		`reprise_table_sample_waits_total{table="a"} 0`,
		`reprise_sample_duration_seconds_count{table="a"} 2`,
		`reprise_sample_requests_total{code="ok",table="a"} 1`,
		`reprise_sample_requests_total{code="rate_limited",table="a"} 1`,
		`reprise_insert_latency_seconds_count{table="a"} 1`,
		`reprise_insert_latency_seconds_count{table="b"} 1`,
		`reprise_rejected_total{code="invalid_argument",table="a"} 1`,
		// Unknown and missing tables share the empty label.
		`reprise_rejected_total{code="not_found",table=""} 1`,
		`reprise_rejected_total{code="invalid_argument",table=""} 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(got, want+"\n") && !strings.Contains(got, want+" ") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if strings.Contains(got, "no such table") {
		t.Error("a table name the service does not have became a label value")
	}
	// The 3ms sample lands in a bucket below 5ms; the 2s one does not.
	if !strings.Contains(got, `reprise_sample_duration_seconds_bucket{table="a",le="0.005`) {
		t.Errorf("no bucket near 5ms in:\n%s", got)
	}
}

func TestWatchTwice(t *testing.T) {
	m := New()
	f := newFake(t)
	if err := m.Watch(f); err != nil {
		t.Fatal(err)
	}
	if err := m.Watch(f); err == nil {
		t.Error("a second Watch succeeded")
	}
}

func TestObserverBeforeWatch(t *testing.T) {
	m := New()
	m.Rejected("a", broker.CodeNotFound)
	if got := scrape(t, m); !strings.Contains(got, `reprise_rejected_total{code="not_found",table=""} 1`) {
		t.Errorf("a rejection before Watch is not counted under the empty table label:\n%s", got)
	}
}

// BenchmarkItemInserted is the cost the metrics add to every item the
// service applies.
func BenchmarkItemInserted(b *testing.B) {
	m := New()
	if err := m.Watch(&fakeService{tables: map[string]*tables.Table{}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.ItemInserted("a", time.Millisecond)
	}
}

func BenchmarkSampleServed(b *testing.B) {
	m := New()
	if err := m.Watch(&fakeService{tables: map[string]*tables.Table{}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.SampleServed("a", 64, time.Millisecond, broker.CodeOK)
	}
}
