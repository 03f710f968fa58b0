package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestRun feeds the runner scenarios in run.py's form and checks what it
// observes: samples, a refused sample, a counter reset, a refused config and
// a count per item.
func TestRun(t *testing.T) {
	in := `[
 {"name": "fifo", "seed": 1,
  "table": {"sampler": {"kind": "fifo"}, "remover": {"kind": "fifo"}, "max_size": 2, "max_times_sampled": -1,
            "limiter": {"preset": "min_size", "min_size": 1}},
  "ops": [{"op": "sample", "n": 1, "timeout_ms": 10},
          {"op": "insert", "id": 7, "priority": 2},
          {"op": "insert", "id": 8, "priority": "inf"},
          {"op": "sample", "n": 2},
          {"op": "info"},
          {"op": "reset"},
          {"op": "info"}]},
 {"name": "bad", "table": {"sampler": {"kind": "prioritized", "exponent": "nan"}, "remover": {"kind": "fifo"},
  "max_size": 1, "limiter": {"preset": "min_size", "min_size": 1}}, "ops": [{"op": "info"}]},
 {"name": "dist", "seed": 2,
  "table": {"sampler": {"kind": "prioritized", "exponent": 0}, "remover": {"kind": "fifo"}, "max_size": 5,
            "limiter": {"preset": "min_size", "min_size": 1}},
  "ops": [{"op": "insert", "id": 1, "priority": 0}, {"op": "insert", "id": 2, "priority": 3},
          {"op": "dist", "n": 50}]}
]`
	var out bytes.Buffer
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	var got map[string][]map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	want := map[string]string{
		"fifo": `[{"error":null,"op":"create"},` +
			`{"error":"rate_limited","items":[],"op":"sample"},` +
			`{"error":null,"op":"insert"},` +
			`{"error":"invalid_argument","op":"insert"},` +
			`{"error":null,"items":[` +
			`{"id":7,"priority":2,"probability":1,"table_size":1,"times_sampled":1},` +
			`{"id":7,"priority":2,"probability":1,"table_size":1,"times_sampled":2}],"op":"sample"},` +
			`{"error":null,"insert_completed":1,"limiter":{"deletes":0,"inserts":1,"max_diff":"inf","min_diff":"-inf",` +
			`"min_size":1,"samples":2,"samples_per_insert":1},"max_size":2,"max_times_sampled":-1,"op":"info",` +
			`"sample_completed":2,"size":1},` +
			`{"error":null,"op":"reset"},` +
			`{"error":null,"insert_completed":0,"limiter":{"deletes":0,"inserts":0,"max_diff":"inf","min_diff":"-inf",` +
			`"min_size":1,"samples":0,"samples_per_insert":1},"max_size":2,"max_times_sampled":-1,"op":"info",` +
			`"sample_completed":0,"size":0}]`,
		"dist": `[{"error":null,"op":"create"},{"error":null,"op":"insert"},{"error":null,"op":"insert"},` +
			`{"counts":{"2":50},"error":null,"n":50,"op":"dist","probabilities":{"2":1}}]`,
	}
	for name, w := range want {
		g, err := json.Marshal(got[name])
		if err != nil {
			t.Fatal(err)
		}
		if string(g) != w {
			t.Errorf("%s:\n got %s\nwant %s", name, g, w)
		}
	}
	if bad := got["bad"]; len(bad) != 1 || bad[0]["error"] != "invalid_argument" || !strings.Contains(bad[0]["message"].(string), "exponent") {
		t.Errorf("bad config: %v", bad)
	}
}
