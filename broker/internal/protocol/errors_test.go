package protocol

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/reprise-rl/reprise/broker/wire"
)

// TestCodesMatchTheWire: every code has the number and name of the wire's
// enum, so a client in another language reads the same catalogue.
func TestCodesMatchTheWire(t *testing.T) {
	if len(wire.Code_name) != len(codeNames) {
		t.Fatalf("the wire has %d codes, the catalogue %d", len(wire.Code_name), len(codeNames))
	}
	for n, name := range wire.Code_name {
		if got, want := Code(n).String(), strings.ToLower(strings.TrimPrefix(name, "CODE_")); got != want {
			t.Errorf("code %d is %q here and %q on the wire", n, got, want)
		}
	}
}

// TestStatusErrors: a status crosses back into the error it stands for,
// matched by errors.Is and errors.As, and an error's code survives the trip.
func TestStatusErrors(t *testing.T) {
	for _, ce := range codeErrors {
		err := fmt.Errorf("calling: %w", Status(ce.code, "why"))
		if !errors.Is(err, ce.err) {
			t.Errorf("%v does not match %v", err, ce.err)
		}
		var se *StatusError
		if !errors.As(err, &se) || se.Code != ce.code || se.Message != "why" {
			t.Errorf("errors.As(%v) = %+v", err, se)
		}
		if got := CodeOf(err); got != ce.code {
			t.Errorf("CodeOf(%v) = %v, want %v", err, got, ce.code)
		}
		if ce.code != CodeInternal && CodeOf(fmt.Errorf("x: %w", ce.err)) != ce.code {
			t.Errorf("CodeOf(%v) = %v, want %v", ce.err, CodeOf(ce.err), ce.code)
		}
	}
	if Status(CodeOK, "") != nil || Status(CodePartial, "2 of 5") != nil {
		t.Error("OK and Partial are not errors")
	}
	if errors.Is(Status(CodeRateLimited, ""), ErrUnknownTable) {
		t.Error("a rate-limited status matches ErrUnknownTable")
	}
	if got := Status(CodeNotFound, `unknown table "x"`).Error(); got != `reprise: not_found: unknown table "x"` {
		t.Errorf("Error() = %q", got)
	}
}
