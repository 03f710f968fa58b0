package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestMultitable(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--embedded", "--episodes", "2", "--steps", "5"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"multitable_2steps: 8 items, multitable_3steps: 6 items; together they reference 2×8 + 3×6 = 34 steps of each column",
		// One chunk per step and column, whichever tables use it.
		"the chunk store gained 20 chunks, one per step and column (10 steps × 2 columns)",
		"a sample from multitable_2steps: observation [2 3], action [2]",
		"a sample from multitable_3steps: observation [3 3], action [3]",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
