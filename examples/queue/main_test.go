package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestQueue(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--embedded", "--items", "40"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if want := "learner received 40 items: each exactly once, in order: ok"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}
