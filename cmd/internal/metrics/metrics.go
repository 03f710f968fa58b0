// Package metrics exports a Reprise table service to Prometheus. Latencies
// and rejections are recorded as they happen, through the service.Observer
// the service calls; table sizes and counters are read from the tables at
// each scrape, so they cost nothing between scrapes.
package metrics

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/tables"
)

// Tables is what the metrics read at a scrape; *service.Service has it.
type Tables interface {
	TableNames() []string
	Table(name string) (*tables.Table, bool)
	Applied() uint64
	InsertPace() float64
}

// Metrics is a registry with Reprise's metrics, and the Observer that feeds
// the event-driven ones. Create it with New, pass it to the service with
// service.WithObserver, then call Watch with the service.
type Metrics struct {
	reg *prometheus.Registry

	sampleDuration *prometheus.HistogramVec
	sampleRequests *prometheus.CounterVec
	insertAge      *prometheus.HistogramVec
	rejected       *prometheus.CounterVec

	// known holds the watched tables' series, bound to their label once:
	// ItemInserted runs for every item. Label values come only from it: a
	// producer naming garbage tables must not create series.
	known atomic.Pointer[map[string]*series]
}

// series are one table's histograms.
type series struct {
	sampleDuration, insertAge prometheus.Observer
}

var _ service.Observer = (*Metrics)(nil)

// latencyBuckets span 50µs (a sample served at once in process) to a
// minute (the longest a request waits for a rate limiter by default).
var latencyBuckets = prometheus.ExponentialBucketsRange(50e-6, 60, 16)

// New returns metrics with Go runtime and process metrics registered, and
// Reprise's own waiting for Watch.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		sampleDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "reprise_sample_duration_seconds",
			Help:    "Time the table service took to answer a sample request, including the wait for the table's rate limiter.",
			Buckets: latencyBuckets,
		}, []string{"table"}),
		sampleRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reprise_sample_requests_total",
			Help: "Sample requests answered, by table and status code (ok, partial, rate_limited, unavailable, internal).",
		}, []string{"table", "code"}),
		insertAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "reprise_insert_latency_seconds",
			Help:    "Time from JetStream storing an item to the item being sampleable in its table, including any wait for the table's rate limiter.",
			Buckets: latencyBuckets,
		}, []string{"table"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reprise_rejected_total",
			Help: `Messages and items the table service refused, by table ("" when none applies) and status code.`,
		}, []string{"table", "code"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.sampleDuration, m.sampleRequests, m.insertAge, m.rejected,
	)
	return m
}

// Watch adds the tables of src to the metrics: their labels become valid
// and their state is read at every scrape. Call it once.
func (m *Metrics) Watch(src Tables) error {
	known := make(map[string]*series)
	for _, name := range src.TableNames() {
		known[name] = &series{sampleDuration: m.sampleDuration.WithLabelValues(name), insertAge: m.insertAge.WithLabelValues(name)}
	}
	if !m.known.CompareAndSwap(nil, &known) {
		return errors.New("metrics: Watch called twice")
	}
	return m.reg.Register(&tableCollector{src: src})
}

// Handler serves the metrics in Prometheus' exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// table returns the label and series of a table name; unknown names share
// the empty label, and have no series of their own.
func (m *Metrics) table(name string) (string, *series) {
	if known := m.known.Load(); known != nil {
		if s := (*known)[name]; s != nil {
			return name, s
		}
	}
	return "", nil
}

// SampleServed records a sample request's latency and outcome.
func (m *Metrics) SampleServed(table string, _ int, latency time.Duration, code service.Code) {
	label, s := m.table(table)
	if s != nil {
		s.sampleDuration.Observe(latency.Seconds())
	} else {
		m.sampleDuration.WithLabelValues(label).Observe(latency.Seconds())
	}
	m.sampleRequests.WithLabelValues(label, code.String()).Inc()
}

// ItemInserted records how long an item took from the stream to its table.
func (m *Metrics) ItemInserted(table string, age time.Duration) {
	label, s := m.table(table)
	if s != nil {
		s.insertAge.Observe(age.Seconds())
		return
	}
	m.insertAge.WithLabelValues(label).Observe(age.Seconds())
}

// Rejected counts a refused message or item.
func (m *Metrics) Rejected(table string, code service.Code) {
	label, _ := m.table(table)
	m.rejected.WithLabelValues(label, code.String()).Inc()
}

// tableCollector reads every table's Info at scrape time.
type tableCollector struct {
	src Tables
}

func tableDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"table"}, nil)
}

var (
	descSize        = tableDesc("reprise_table_size", "Items in the table.")
	descMaxSize     = tableDesc("reprise_table_max_size", "Most items the table holds before its remover evicts.")
	descBytesHeld   = tableDesc("reprise_table_bytes_held", "Bytes of the chunks the table's items reference (a chunk shared with other tables counts in each).")
	descChunks      = tableDesc("reprise_table_chunks", "Distinct chunks the table's items reference.")
	descInserts     = tableDesc("reprise_table_inserts_total", "Items inserted into the table.")
	descSamples     = tableDesc("reprise_table_samples_total", "Items sampled from the table.")
	descDeletes     = tableDesc("reprise_table_deletes_total", "Items removed from the table: deletes, evictions and items sampled max_times_sampled times.")
	descEvictions   = tableDesc("reprise_table_evictions_total", "Items the remover evicted to keep the table within max_size.")
	descInsertWaits = tableDesc("reprise_table_insert_waits_total", "Inserts the table's rate limiter held at least once.")
	descSampleWaits = tableDesc("reprise_table_sample_waits_total", "Sample calls the table's rate limiter held at least once.")
	descApplied     = prometheus.NewDesc("reprise_applied_sequence", "Last stream sequence the table service applied to its tables.", nil, nil)
	descInsertPace  = prometheus.NewDesc("reprise_insert_pace_items_per_second", "Items a second the service lets in while it paces inserts so that learners keep their pace (service.sample_priority); 0 while it does not.", nil, nil)
)

func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSize, descMaxSize, descBytesHeld, descChunks, descInserts, descSamples, descDeletes, descEvictions, descInsertWaits, descSampleWaits, descApplied, descInsertPace} {
		ch <- d
	}
}

func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(c.src.Applied()))
	ch <- prometheus.MustNewConstMetric(descInsertPace, prometheus.GaugeValue, c.src.InsertPace())
	for _, name := range c.src.TableNames() {
		t, ok := c.src.Table(name)
		if !ok {
			continue
		}
		in := t.Info()
		for _, v := range []struct {
			desc  *prometheus.Desc
			typ   prometheus.ValueType
			value int64
		}{
			{descSize, prometheus.GaugeValue, in.Size},
			{descMaxSize, prometheus.GaugeValue, in.Config.MaxSize},
			{descBytesHeld, prometheus.GaugeValue, in.BytesHeld},
			{descChunks, prometheus.GaugeValue, int64(in.Chunks)},
			{descInserts, prometheus.CounterValue, in.Counters.Inserts},
			{descSamples, prometheus.CounterValue, in.Counters.Samples},
			{descDeletes, prometheus.CounterValue, in.Counters.Deletes},
			{descEvictions, prometheus.CounterValue, in.Counters.Evictions},
			{descInsertWaits, prometheus.CounterValue, in.Counters.InsertWaits},
			{descSampleWaits, prometheus.CounterValue, in.Counters.SampleWaits},
		} {
			ch <- prometheus.MustNewConstMetric(v.desc, v.typ, float64(v.value), name)
		}
	}
}
