package daemon

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamplesAgainstReprised runs the examples as a user does: reprised
// with examples/reprise.yaml, then each example's binary against it. It
// checks that the examples' tables and the file agree, and that each
// example prints what it promises.
func TestExamplesAgainstReprised(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the examples")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the examples with")
	}
	bin := t.TempDir()
	build := exec.Command(gobin, "build", "-o", bin+string(filepath.Separator), "github.com/reprise-rl/reprise/examples/...")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the examples: %v\n%s", err, out)
	}
	r := start(t, "--config", "../../../examples/reprise.yaml", "--listen", "127.0.0.1:-1", "--store", t.TempDir(), "--log-level", "warn")
	example := func(name string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, name), append([]string{"--nats", r.url}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"queue", []string{"--items", "50"}, []string{"learner received 50 items: each exactly once, in order: ok"}},
		{"actorlearner", []string{"--items", "400"}, []string{"achieved samples per insert: 2.000 (target 2)"}},
		{"multitable", nil, []string{"the chunk store gained 60 chunks", "observation [3 3]"}},
		{"prioritized", []string{"--samples", "500"}, []string{"before the updates", "after the updates"}},
		{"staleness", []string{"--updates", "8"}, []string{"every sampled item was at most 2 versions behind"}},
	}
	for _, tt := range tests {
		// Twice: an example resets its tables, so a rerun behaves alike.
		for run := range 2 {
			out, err := example(tt.name, tt.args...)
			if err != nil {
				t.Errorf("%s (run %d): %v\n%s", tt.name, run+1, err, out)
				continue
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("%s (run %d) output lacks %q:\n%s", tt.name, run+1, w, out)
				}
			}
		}
	}

	// Against a reprised without the examples' tables, an example says
	// how to start the right one.
	plain := start(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir(), "--log-level", "warn")
	out, err := exec.Command(filepath.Join(bin, "queue"), "--nats", plain.url).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "go run ./cmd/reprised --config examples/reprise.yaml") || !strings.Contains(string(out), "--embedded") {
		t.Errorf("queue against a reprised without its table: %v\n%s", err, out)
	}
}
