package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestPrioritized(t *testing.T) {
	const samples = 1000
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--embedded", "--items", "50", "--samples", fmt.Sprint(samples)}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var phases []struct{ got, want, mean float64 }
	for _, line := range strings.Split(out.String(), "\n") {
		var got, want, mean float64
		var n int
		i := strings.Index(line, "hard items are")
		if i < 0 {
			continue
		}
		if _, err := fmt.Sscanf(line[i:], "hard items are %g%% of %d sampled (expected %g%%), mean priority %g", &got, &n, &want, &mean); err != nil {
			t.Fatalf("cannot read %q: %v", line, err)
		}
		phases = append(phases, struct{ got, want, mean float64 }{got / 100, want / 100, mean})
	}
	if len(phases) != 2 {
		t.Fatalf("want a before and an after line:\n%s", out.String())
	}
	// The sampled count of hard items is binomial(samples, want): 5
	// standard deviations make a false failure a one in a million event.
	for i, p := range phases {
		sigma := math.Sqrt(p.want * (1 - p.want) / samples)
		if math.Abs(p.got-p.want) > 5*sigma {
			t.Errorf("phase %d: hard share %.3f, want %.3f ± %.3f", i, p.got, p.want, 5*sigma)
		}
	}
	before, after := phases[0], phases[1]
	if before.want != 0.1 || before.mean != 1 {
		t.Errorf("before the updates: expected share %v and mean priority %v, want 0.1 and 1", before.want, before.mean)
	}
	if after.want < 0.3 || after.mean >= 1 {
		t.Errorf("after the updates: expected share %v and mean priority %v; the sampling did not shift to the hard items", after.want, after.mean)
	}
}
