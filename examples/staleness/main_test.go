package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestStaleness(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--embedded", "--updates", "12"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if want := "every sampled item was at most 2 versions behind"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}
