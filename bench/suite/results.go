package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/reprise-rl/reprise/internal/load"
)

// The systems compared.
const (
	sysReprise   = "reprise"
	sysJetStream = "jetstream"
	sysReverb    = "reverb"
	// sysJetStreamConsumed is raw JetStream publishing as sysJetStream does
	// while one consumer receives every message (load.RawPublishConsumed).
	sysJetStreamConsumed = "jetstream_consumed"
)

var systemNames = map[string]string{sysReprise: "Reprise", sysJetStream: "raw JetStream", sysReverb: "Reverb",
	sysJetStreamConsumed: "raw JetStream, consumed"}

// Results is everything one run of the suite measured; results.json holds
// it whole.
type Results struct {
	Machine    Machine   `json:"machine"`
	Quick      bool      `json:"quick"`
	Started    time.Time `json:"started"`
	Seconds    float64   `json:"seconds"`
	WarmupSec  float64   `json:"warmup_sec"`
	PointSec   float64   `json:"point_sec"`
	Throughput []Point   `json:"throughput"`
	Mixed      []Mixed   `json:"mixed"`
	// Actors is the actor-load run: learners beside few, then many
	// producers.
	Actors []ActorLoad `json:"actors"`
	// ActorsLearnerRatio is the learners' items/s beside the most
	// producers over theirs beside the fewest.
	ActorsLearnerRatio float64 `json:"actors_learner_ratio,omitempty"`
	// Atari is Reprise's Atari-like run.
	Atari   *load.AtariResult `json:"atari,omitempty"`
	Latency []Latency         `json:"latency"`
	Memory  []MemoryPoint     `json:"memory"`
	// Shards are the points of the shards section, and ShardSummary the
	// best of each shard count, kind of client, mode and payload.
	Shards       []ShardPoint `json:"shards"`
	ShardSummary []ShardPoint `json:"shard_summary"`
	Reverb       ReverbStatus `json:"reverb"`
	Summary      []SummaryRow `json:"summary"`
	Targets      []Target     `json:"targets"`
}

// Point is one throughput measurement: one system, mode, payload size and
// client count.
type Point struct {
	System      string  `json:"system"`
	Mode        string  `json:"mode"`
	Payload     int     `json:"payload_bytes"`
	Clients     int     `json:"clients"`
	Batch       int     `json:"batch"`
	ItemsPerSec float64 `json:"items_per_sec"`
	BytesPerSec float64 `json:"bytes_per_sec"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	// Load1 is the machine's 1-minute load average as the point started.
	Load1 float64 `json:"load1"`
}

// Mixed is one actor/learner run under SampleToInsertRatio: clients
// inserters and clients samplers at once.
type Mixed struct {
	System           string  `json:"system"`
	Payload          int     `json:"payload_bytes"`
	Clients          int     `json:"clients"`
	Batch            int     `json:"batch"`
	SamplesPerInsert float64 `json:"samples_per_insert"`
	// InsertItemsPerSec counts items as the actors' flushes return: stored
	// durably. Reprise's actors may run ahead of the limiter by their
	// window of unapplied items; AppliedPerSec counts the items the table
	// took in (Reverb's flush returns once the table took them).
	InsertItemsPerSec float64 `json:"insert_items_per_sec"`
	AppliedPerSec     float64 `json:"applied_items_per_sec"`
	SampleItemsPerSec float64 `json:"sample_items_per_sec"`
	// Achieved is samples per insert as the table counted them.
	Achieved    float64 `json:"achieved_samples_per_insert"`
	InsertP50Ms float64 `json:"insert_p50_ms"`
	SampleP50Ms float64 `json:"sample_p50_ms"`
}

// ActorLoad is one run of learners beside unthrottled producers on a
// table that lets every sample through.
type ActorLoad struct {
	Producers   int `json:"producers"`
	Learners    int `json:"learners"`
	Payload     int `json:"payload_bytes"`
	InsertBatch int `json:"insert_batch"`
	SampleBatch int `json:"sample_batch"`
	// LearnerItemsPerSec is what all learners together sampled;
	// LearnerP50Ms and LearnerP99Ms are per sample request.
	LearnerItemsPerSec  float64 `json:"learner_items_per_sec"`
	LearnerP50Ms        float64 `json:"learner_batch_p50_ms"`
	LearnerP99Ms        float64 `json:"learner_batch_p99_ms"`
	ProducerItemsPerSec float64 `json:"producer_items_per_sec"`
	// Load1 is the machine's 1-minute load average as the run started.
	Load1 float64 `json:"load1"`
}

// Latency is one system's single-item figures over loopback TCP. For raw
// JetStream, Sample is a request-reply of one item's bytes and
// InsertToDurable a publish waiting for its ack: the floors under
// Reprise's figures on the same server.
type Latency struct {
	System string `json:"system"`
	// Sample: one client asking for one 400-byte item at a time.
	SampleP50Us float64 `json:"sample_p50_us"`
	SampleP99Us float64 `json:"sample_p99_us"`
	// InsertToSampled: from the actor's append to a waiting learner
	// holding the item.
	InsertToSampledP50Us float64 `json:"insert_to_sampled_p50_us"`
	InsertToSampledP99Us float64 `json:"insert_to_sampled_p99_us"`
	// InsertToDurable: from the append until the writer's flush returns.
	InsertToDurableP50Us float64 `json:"insert_to_durable_p50_us"`
	InsertToDurableP99Us float64 `json:"insert_to_durable_p99_us"`
}

// MemoryPoint is the resident memory of a server process holding Items
// items of Payload bytes each.
type MemoryPoint struct {
	System  string `json:"system"`
	Series  string `json:"series"`
	Payload int    `json:"payload_bytes"`
	Items   int64  `json:"items"`
	// PayloadBytes is Items × Payload: the data users put in.
	PayloadBytes int64 `json:"payload_bytes_held"`
	// StoredBytes is what the server reports holding (encoded chunks),
	// where it reports it.
	StoredBytes int64 `json:"stored_bytes,omitempty"`
	RSSBytes    int64 `json:"rss_bytes"`
	// BaseRSSBytes is the same process's resident memory before the fill.
	BaseRSSBytes int64 `json:"base_rss_bytes"`
	// RestRSSBytes is its resident memory at rest: after the plan's rest
	// with nothing inserted or sampled, once the NATS server dropped its
	// cache of the blocks the fill wrote and reprised gave back its free
	// memory (gcpace). Zero where not measured.
	RestRSSBytes int64 `json:"rest_rss_bytes,omitempty"`
}

// ReverbStatus says whether Reverb ran and, if not, why.
type ReverbStatus struct {
	Ran     bool   `json:"ran"`
	Venv    string `json:"venv,omitempty"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

// SummaryRow is the best of each system over client counts for one mode
// and payload size, and Reprise's ratio to the others.
type SummaryRow struct {
	Mode        string  `json:"mode"`
	Payload     int     `json:"payload_bytes"`
	Batch       int     `json:"batch"`
	Reprise     *Point  `json:"reprise,omitempty"`
	JetStream   *Point  `json:"jetstream,omitempty"`
	Reverb      *Point  `json:"reverb,omitempty"`
	VsJetStream float64 `json:"reprise_over_jetstream,omitempty"`
	VsReverb    float64 `json:"reprise_over_reverb,omitempty"`
	// Consumed (inserts only) is raw JetStream's publishing with a consumer
	// that receives every message: the most Reprise's inserts could reach
	// on a machine the server, the service and the clients share.
	Consumed   *Point  `json:"jetstream_consumed,omitempty"`
	VsConsumed float64 `json:"reprise_over_jetstream_consumed,omitempty"`
}

// Target is one of the targets and how far Reprise is from it.
type Target struct {
	Name     string `json:"name"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      *bool  `json:"met,omitempty"`
}

// best returns the point with the most items/s among those that match.
func best(points []Point, system, mode string, payload int) *Point {
	var b *Point
	for i := range points {
		p := &points[i]
		if p.System == system && p.Mode == mode && p.Payload == payload && (b == nil || p.ItemsPerSec > b.ItemsPerSec) {
			b = p
		}
	}
	return b
}

func find(points []Point, system, mode string, payload, clients int) *Point {
	for i := range points {
		p := &points[i]
		if p.System == system && p.Mode == mode && p.Payload == payload && p.Clients == clients {
			return p
		}
	}
	return nil
}

func ratio(a, b *Point) float64 {
	if a == nil || b == nil || b.ItemsPerSec == 0 {
		return 0
	}
	return a.ItemsPerSec / b.ItemsPerSec
}

func (r *Results) summarize() {
	r.Summary = nil
	for _, mode := range []string{"insert", "sample"} {
		for _, payload := range payloadsIn(r.Throughput) {
			row := SummaryRow{Mode: mode, Payload: payload,
				Reprise: best(r.Throughput, sysReprise, mode, payload), JetStream: best(r.Throughput, sysJetStream, mode, payload),
				Reverb: best(r.Throughput, sysReverb, mode, payload), Consumed: best(r.Throughput, sysJetStreamConsumed, mode, payload)}
			for _, p := range []*Point{row.Reprise, row.JetStream, row.Reverb} {
				if p != nil {
					row.Batch = p.Batch
				}
			}
			row.VsJetStream, row.VsReverb = ratio(row.Reprise, row.JetStream), ratio(row.Reprise, row.Reverb)
			row.VsConsumed = ratio(row.Reprise, row.Consumed)
			if row.Reprise != nil || row.Reverb != nil {
				r.Summary = append(r.Summary, row)
			}
		}
	}
	r.ActorsLearnerRatio, _, _ = r.actorLoadRatio()
	r.summarizeShards()
	r.Targets = r.targets()
}

func payloadsIn(points []Point) []int {
	var out []int
	for _, p := range points {
		if !slices.Contains(out, p.Payload) {
			out = append(out, p.Payload)
		}
	}
	slices.Sort(out)
	return out
}

func met(ok bool) *bool { return &ok }

// The throughput targets: Reprise's best over client counts at
// least least × raw JetStream's best in the same run, by items/s (the
// same as by bytes/s: both move the same items).
var rawTargets = []struct {
	mode    string
	payload int
	least   float64
}{
	{"sample", 400, 0.6}, {"sample", 4000, 0.8}, {"sample", 40000, 0.9}, {"sample", 400000, 0.9},
	{"insert", 400, 0.7}, {"insert", 4000, 0.7}, {"insert", 40000, 0.8}, {"insert", 400000, 0.8},
}

// Targets on figures other than throughput.
const (
	memoryPerByteGoal   = 1.3
	memoryPerItemGoal   = 300
	sampleLatencyGoal   = 1.1
	actorLoadGoal       = 0.5
	reverbWithinRawGoal = 0.9
)

// targets checks the targets against what was measured.
func (r *Results) targets() []Target {
	var ts []Target
	add := func(name, goal string, measured func() (string, *bool)) {
		m, ok := measured()
		if m == "" {
			m = "not measured in this run"
		}
		ts = append(ts, Target{Name: name, Goal: goal, Measured: m, Met: ok})
	}
	for _, t := range rawTargets {
		batch, goal := sampleBatch(t.payload), fmt.Sprintf("≥ %.1f × raw JetStream request-reply", t.least)
		if t.mode == "insert" {
			batch, goal = insertBatch(t.payload), fmt.Sprintf("≥ %.1f × raw JetStream publishing the same bytes in the same batches", t.least)
		}
		name := fmt.Sprintf("%ss, %s items, batch %d", t.mode, sizeName(t.payload), batch)
		rp, jp := best(r.Throughput, sysReprise, t.mode, t.payload), best(r.Throughput, sysJetStream, t.mode, t.payload)
		add(name, goal, func() (string, *bool) {
			if rp == nil || jp == nil {
				return "", nil
			}
			x := ratio(rp, jp)
			return fmt.Sprintf("%.2f × (%sB/s vs %sB/s)", x, si(rp.BytesPerSec), si(jp.BytesPerSec)), met(x >= t.least)
		})
	}
	add("against Reverb", fmt.Sprintf("ahead where raw JetStream is ahead of Reverb, else ≥ %.1f × raw (inserts and samples per payload)", reverbWithinRawGoal),
		r.reverbTarget)
	m := memoryFigures(r.Memory, sysReprise)
	// Judged at rest where measured: right after a fill the NATS server
	// still caches the blocks written in the last 10 s, memory that comes
	// with the rate of inserts, not with what the table holds.
	add("memory per payload byte held", fmt.Sprintf("≤ %.1f × payload over the base (resident, 4 kB items; at rest where measured)", memoryPerByteGoal), func() (string, *bool) {
		if m.perByte == 0 {
			return "", nil
		}
		s := fmt.Sprintf("%.2f × over a %sB base (%sB held)", m.perByte, si(float64(m.base)), si(float64(m.held)))
		if !m.restByte {
			return s, met(m.perByte <= memoryPerByteGoal)
		}
		return fmt.Sprintf("%.2f × at rest; %s right after the fill", m.restPerByte, s), met(m.restPerByte <= memoryPerByteGoal)
	})
	add("memory per item beyond its payload", fmt.Sprintf("≤ %d B (resident, 16 B items; at rest where measured)", memoryPerItemGoal), func() (string, *bool) {
		if m.perItem == 0 {
			return "", nil
		}
		s := fmt.Sprintf("%.0f B (%d-byte items)", m.perItem, m.itemPayload)
		if !m.restItem {
			return s, met(m.perItem <= memoryPerItemGoal)
		}
		return fmt.Sprintf("%.0f B at rest; %s right after the fill", m.restPerItem, s), met(m.restPerItem <= memoryPerItemGoal)
	})
	add("single-item sample p50, loopback TCP", fmt.Sprintf("≤ %.1f × raw request-reply p50", sampleLatencyGoal), func() (string, *bool) {
		l, raw := r.latencyOf(sysReprise), r.latencyOf(sysJetStream)
		if l == nil || raw == nil || raw.SampleP50Us == 0 {
			return "", nil
		}
		x := l.SampleP50Us / raw.SampleP50Us
		return fmt.Sprintf("%.2f × (%.0f µs vs %.0f µs)", x, l.SampleP50Us, raw.SampleP50Us), met(x <= sampleLatencyGoal)
	})
	add("learners under actor load", fmt.Sprintf("≥ %.1f × the items/s beside few producers, beside many", actorLoadGoal), func() (string, *bool) {
		x, few, many := r.actorLoadRatio()
		if few == nil {
			return "", nil
		}
		return fmt.Sprintf("%.2f × (%s items/s beside %d producers vs %s beside %d)", x,
			si(many.LearnerItemsPerSec), many.Producers, si(few.LearnerItemsPerSec), few.Producers), met(x >= actorLoadGoal)
	})
	ts = append(ts, Target{Name: "apply loop, per item", Goal: "≤ 1.5 µs",
		Measured: "by go test -bench BenchmarkApplyInsert ./broker/service, not by the suite"})
	return ts
}

// reverbTarget compares Reprise with Reverb on each insert and sample
// workload that all three systems ran: Reprise must be ahead of Reverb
// where raw JetStream is, and within reverbWithinRawGoal of raw where raw
// JetStream is not ahead either.
func (r *Results) reverbTarget() (string, *bool) {
	var misses []string
	total := 0
	for _, row := range r.Summary {
		if row.Reprise == nil || row.JetStream == nil || row.Reverb == nil {
			continue
		}
		total++
		name := fmt.Sprintf("%ss of %s", row.Mode, sizeName(row.Payload))
		switch {
		case row.JetStream.ItemsPerSec > row.Reverb.ItemsPerSec && row.VsReverb < 1:
			misses = append(misses, fmt.Sprintf("%s (%.2f × Reverb, raw %.2f ×)", name, row.VsReverb, ratio(row.JetStream, row.Reverb)))
		case row.JetStream.ItemsPerSec <= row.Reverb.ItemsPerSec && row.VsJetStream < reverbWithinRawGoal:
			misses = append(misses, fmt.Sprintf("%s (%.2f × raw, which trails Reverb)", name, row.VsJetStream))
		}
	}
	if total == 0 {
		return "", nil
	}
	measured := fmt.Sprintf("met on %d of %d workloads", total-len(misses), total)
	if len(misses) > 0 {
		measured += "; missed on " + strings.Join(misses, ", ")
	}
	return measured, met(len(misses) == 0)
}

// actorLoadRatio is the learners' items/s beside the most producers over
// theirs beside the fewest.
func (r *Results) actorLoadRatio() (x float64, few, many *ActorLoad) {
	for i := range r.Actors {
		a := &r.Actors[i]
		if few == nil || a.Producers < few.Producers {
			few = a
		}
		if many == nil || a.Producers > many.Producers {
			many = a
		}
	}
	if few == nil || few == many || few.LearnerItemsPerSec == 0 {
		return 0, nil, nil
	}
	return many.LearnerItemsPerSec / few.LearnerItemsPerSec, few, many
}

func (r *Results) latencyOf(system string) *Latency {
	for i := range r.Latency {
		if r.Latency[i].System == system {
			return &r.Latency[i]
		}
	}
	return nil
}

// memFigures are the memory figures of one system: resident bytes per
// payload byte over the base (from the largest point of the payload
// series) and resident bytes per item beyond its payload (from the
// per-item series).
type memFigures struct {
	perByte     float64
	base, held  int64
	perItem     float64
	itemPayload int
	// restPerByte and restPerItem are the same at rest, where restByte
	// and restItem say they were measured.
	restPerByte, restPerItem float64
	restByte, restItem       bool
}

func memoryFigures(points []MemoryPoint, system string) memFigures {
	var f memFigures
	for _, p := range points {
		if p.System != system || p.PayloadBytes == 0 {
			continue
		}
		switch p.Series {
		case "payload":
			if p.PayloadBytes >= f.held {
				f.held, f.base = p.PayloadBytes, p.BaseRSSBytes
				f.perByte = float64(p.RSSBytes-p.BaseRSSBytes) / float64(p.PayloadBytes)
				f.restByte = p.RestRSSBytes > 0
				f.restPerByte = float64(p.RestRSSBytes-p.BaseRSSBytes) / float64(p.PayloadBytes)
			}
		case "per-item":
			if p.Items > 0 {
				f.perItem = float64(p.RSSBytes-p.BaseRSSBytes-p.PayloadBytes) / float64(p.Items)
				f.itemPayload = p.Payload
				f.restItem = p.RestRSSBytes > 0
				f.restPerItem = float64(p.RestRSSBytes-p.BaseRSSBytes-p.PayloadBytes) / float64(p.Items)
			}
		}
	}
	return f
}

// si formats a number with an SI prefix: 1.23M, 456k.
func si(v float64) string {
	abs := math.Abs(v)
	switch {
	case abs >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case abs >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case abs >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// write saves results.json, the CSV files and summary.md into dir.
func (r *Results) write(dir string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, "throughput.csv"), r.throughputRows()); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, "memory.csv"), r.memoryRows()); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "summary.md"))
	if err != nil {
		return err
	}
	r.markdown(f)
	return f.Close()
}

func writeCSV(path string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	if err := w.WriteAll(rows); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func ff(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

func (r *Results) throughputRows() [][]string {
	rows := [][]string{{"system", "mode", "payload_bytes", "clients", "batch", "items_per_sec", "bytes_per_sec", "p50_ms", "p99_ms", "load1",
		"reprise_over_jetstream", "reprise_over_reverb", "reprise_over_jetstream_consumed"}}
	for _, p := range r.Throughput {
		var vs [3]string
		if p.System == sysReprise {
			for i, sys := range []string{sysJetStream, sysReverb, sysJetStreamConsumed} {
				if x := ratio(&p, find(r.Throughput, sys, p.Mode, p.Payload, p.Clients)); x > 0 {
					vs[i] = ff(x)
				}
			}
		}
		rows = append(rows, []string{p.System, p.Mode, strconv.Itoa(p.Payload), strconv.Itoa(p.Clients), strconv.Itoa(p.Batch),
			ff(p.ItemsPerSec), ff(p.BytesPerSec), ff(p.P50Ms), ff(p.P99Ms), ff(p.Load1), vs[0], vs[1], vs[2]})
	}
	return rows
}

func (r *Results) memoryRows() [][]string {
	rows := [][]string{{"system", "series", "payload_bytes", "items", "payload_bytes_held", "stored_bytes", "rss_bytes", "base_rss_bytes", "rest_rss_bytes"}}
	for _, m := range r.Memory {
		rows = append(rows, []string{m.System, m.Series, strconv.Itoa(m.Payload), strconv.FormatInt(m.Items, 10),
			strconv.FormatInt(m.PayloadBytes, 10), strconv.FormatInt(m.StoredBytes, 10), strconv.FormatInt(m.RSSBytes, 10), strconv.FormatInt(m.BaseRSSBytes, 10),
			strconv.FormatInt(m.RestRSSBytes, 10)})
	}
	return rows
}

func sizeName(b int) string {
	switch {
	case b >= 1000 && b%1000 == 0:
		return fmt.Sprintf("%d kB", b/1000)
	}
	return fmt.Sprintf("%d B", b)
}

// markdown writes the tables bench/README.md shows.
func (r *Results) markdown(w io.Writer) {
	fmt.Fprintf(w, "Measured %s on %s", r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Machine)
	fmt.Fprintf(w, " (load average %.1f at the start, %.1f at the end; one core: %s at the start, %s at the end); %.1fs per point after %.1fs warmup; suite took %.0fs.\n\n",
		r.Machine.LoadStart[0], r.Machine.LoadEnd[0], r.Machine.SpeedStart, r.Machine.SpeedEnd, r.PointSec, r.WarmupSec, r.Seconds)

	fmt.Fprintln(w, "| mode | payload | batch | Reprise items/s | Reprise bytes/s | raw JetStream items/s | Reprise ÷ raw | Reverb items/s | Reprise ÷ Reverb | raw JetStream, consumed, items/s | Reprise ÷ consumed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	cell := func(p *Point) string {
		if p == nil {
			return "–"
		}
		return fmt.Sprintf("%s (%d cl.)", si(p.ItemsPerSec), p.Clients)
	}
	x := func(v float64) string {
		if v == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", v)
	}
	for _, row := range r.Summary {
		bytes := "–"
		if row.Reprise != nil {
			bytes = si(row.Reprise.BytesPerSec) + "B/s"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", row.Mode, sizeName(row.Payload), row.Batch,
			cell(row.Reprise), bytes, cell(row.JetStream), x(row.VsJetStream), cell(row.Reverb), x(row.VsReverb), cell(row.Consumed), x(row.VsConsumed))
	}
	if slices.ContainsFunc(r.Summary, func(row SummaryRow) bool { return row.Consumed != nil }) {
		fmt.Fprintln(w, "\nRaw JetStream, consumed: the same publishing as raw JetStream's, while one pull consumer on its own connection receives every message and throws it away, what the server does for Reprise's table service and raw publishing never pays.")
	}

	if len(r.Mixed) > 0 {
		fmt.Fprintln(w, "\nMixed actors and learners under SampleToInsertRatio:")
		fmt.Fprintln(w, "\n| system | payload | clients (each kind) | batch | samples per insert (set / achieved) | inserts/s stored | inserts/s into the table | samples/s |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
		for _, m := range r.Mixed {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %.0f / %.2f | %s | %s | %s |\n", systemNames[m.System], sizeName(m.Payload), m.Clients, m.Batch,
				m.SamplesPerInsert, m.Achieved, si(m.InsertItemsPerSec), si(m.AppliedPerSec), si(m.SampleItemsPerSec))
		}
	}
	if len(r.Actors) > 0 {
		a := r.Actors[0]
		fmt.Fprintf(w, "\nLearners under actor load (Reprise; %s items, producers flush %d, learners sample %d, a table that lets every sample through):\n",
			sizeName(a.Payload), a.InsertBatch, a.SampleBatch)
		fmt.Fprintln(w, "\n| producers | learners | learner items/s | learner batch p50 | learner batch p99 | producer items/s | load average |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		for _, a := range r.Actors {
			fmt.Fprintf(w, "| %d | %d | %s | %.1f ms | %.1f ms | %s | %.1f |\n", a.Producers, a.Learners, si(a.LearnerItemsPerSec),
				a.LearnerP50Ms, a.LearnerP99Ms, si(a.ProducerItemsPerSec), a.Load1)
		}
		if x, few, many := r.actorLoadRatio(); few != nil {
			fmt.Fprintf(w, "\nLearners beside %d producers get %.2f × the items/s they get beside %d.\n", many.Producers, x, few.Producers)
		}
	}
	if a := r.Atari; a != nil {
		fmt.Fprintf(w, "\nAtari-like (Reprise; 84×84 uint8 frames, chunks of %d steps, delta + zstd, items of %d steps every %d): %d actors %s steps/s (%sB/s raw), compression %.1f× on the wire; %d learners %s items/s (%sB/s decoded).\n",
			a.ChunkLength, a.SequenceLength, a.Period, a.Actors, si(a.StepsPerSec), si(a.RawBytesPerSec), a.CompressionRatio,
			a.Learners, si(a.Sample.ItemsPerSec), si(a.Sample.BytesPerSec))
	}
	if len(r.Latency) > 0 {
		fmt.Fprintln(w, "\n| latency over loopback TCP | p50 | p99 |")
		fmt.Fprintln(w, "|---|---|---|")
		for _, l := range r.Latency {
			if l.System == sysJetStream {
				fmt.Fprintf(w, "| raw JetStream: request-reply of 400 B (responder in another process) | %.0f µs | %.0f µs |\n", l.SampleP50Us, l.SampleP99Us)
				fmt.Fprintf(w, "| raw JetStream: publish of 400 B until acked | %.0f µs | %.0f µs |\n", l.InsertToDurableP50Us, l.InsertToDurableP99Us)
				continue
			}
			name := systemNames[l.System]
			fmt.Fprintf(w, "| %s: single-item sample (400 B) | %.0f µs | %.0f µs |\n", name, l.SampleP50Us, l.SampleP99Us)
			fmt.Fprintf(w, "| %s: insert to sampled by a waiting learner | %.0f µs | %.0f µs |\n", name, l.InsertToSampledP50Us, l.InsertToSampledP99Us)
			fmt.Fprintf(w, "| %s: insert to durable (flush returned) | %.0f µs | %.0f µs |\n", name, l.InsertToDurableP50Us, l.InsertToDurableP99Us)
		}
	}
	if len(r.Memory) > 0 {
		fmt.Fprintln(w, "\n| memory | base RSS | RSS over base per payload byte | at rest | bytes per item beyond payload | at rest |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|")
		rest := func(measured bool, v float64, format string) string {
			if !measured {
				return "–"
			}
			return fmt.Sprintf(format, v)
		}
		for _, sys := range []string{sysReprise, sysReverb} {
			m := memoryFigures(r.Memory, sys)
			if m.perByte == 0 && m.perItem == 0 {
				continue
			}
			fmt.Fprintf(w, "| %s | %sB | %.2f (at %sB held) | %s | %.0f B (%d-byte items) | %s |\n", systemNames[sys], si(float64(m.base)), m.perByte, si(float64(m.held)),
				rest(m.restByte, m.restPerByte, "%.2f"), m.perItem, m.itemPayload, rest(m.restItem, m.restPerItem, "%.0f B"))
		}
	}
	r.shardsMarkdown(w)
	fmt.Fprintln(w, "\n| target | goal | measured | met |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, t := range r.Targets {
		m := "–"
		if t.Met != nil {
			m = map[bool]string{true: "yes", false: "**no**"}[*t.Met]
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.Name, t.Goal, t.Measured, m)
	}
	if !r.Reverb.Ran && r.Reverb.Error != "" {
		what := "did not run"
		if slices.ContainsFunc(r.Throughput, func(p Point) bool { return p.System == sysReverb }) {
			what = "stopped before the end; its figures above are those it gave"
		}
		fmt.Fprintf(w, "\nReverb %s: %s\n", what, strings.TrimSpace(r.Reverb.Error))
	}
}
