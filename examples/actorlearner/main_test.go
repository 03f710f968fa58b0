package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestActorLearner(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--embedded", "--actors", "3", "--items", "300"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	// Once the actors stop, the learner takes exactly what the limiter
	// allows: samples_per_insert per item, as min_diff is 2·100 − 200 = 0.
	for _, want := range []string{"actors inserted 300 items of 3 steps", "the learner sampled 600 items", "achieved samples per insert: 2.000 (target 2)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
