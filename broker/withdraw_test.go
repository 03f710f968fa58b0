package broker

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
)

// TestGoldenSampleRequests: the client's sample requests and withdrawals
// are the bytes of the golden vectors (broker/service/golden_test.go
// writes them, pytest checks Python's against them).
func TestGoldenSampleRequests(t *testing.T) {
	raw, err := os.ReadFile("../python/tests/golden/go_sample_requests.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors []struct {
		Name       string `json:"name"`
		Data       []byte `json:"data"`
		Table      string `json:"table"`
		NumSamples int32  `json:"num_samples"`
		TimeoutMs  int64  `json:"timeout_ms"`
		Flexible   bool   `json:"flexible"`
		Withdraw   string `json:"withdraw"`
	}
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	for _, v := range vectors {
		var got []byte
		if v.Withdraw != "" {
			got = withdrawal(v.Withdraw)
		} else {
			req := newSampleRequest(v.Table, int(v.NumSamples), sampleOptions{flexible: v.Flexible})
			req.TimeoutMs = v.TimeoutMs
			got, err = proto.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, v.Data) {
			var m wire.SampleRequest
			_ = proto.Unmarshal(got, &m)
			t.Errorf("%s: the client sends %x (%v), the vector holds %x", v.Name, got, &m, v.Data)
		}
	}
}
