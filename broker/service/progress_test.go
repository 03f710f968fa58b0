package service

import (
	"testing"
	"time"
)

// TestProgressGap: a few producers hear of their applied messages at once;
// more share rarer updates, so that the server fans out at most about 50,000
// deliveries a second up to 500 producers, and updates come at least every
// 10 ms whatever their number.
func TestProgressGap(t *testing.T) {
	for _, tt := range []struct {
		producers int64
		want      time.Duration
	}{
		{0, 20 * time.Microsecond},
		{1, 20 * time.Microsecond},
		{10, 200 * time.Microsecond},
		{50, time.Millisecond},
		{500, 10 * time.Millisecond},
		{100_000, 10 * time.Millisecond},
	} {
		got := progressGap(tt.producers)
		if got != tt.want {
			t.Errorf("progressGap(%d) = %v, want %v", tt.producers, got, tt.want)
		}
		if rate := float64(max(tt.producers, 1)) / got.Seconds(); tt.producers <= 500 && rate > 50_001 {
			t.Errorf("%d producers get %.0f deliveries a second", tt.producers, rate)
		}
	}
}
