package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// Programs builds commands of this module on first use, once per test
// binary, into one temporary directory. A sync.Once has no owner that could
// delete what it made, so the package's TestMain calls Remove after m.Run:
// otherwise every test run leaves tens of megabytes of binaries in TMPDIR.
type Programs struct {
	prefix string
	pkgs   []string

	once sync.Once
	dir  string
	bins map[string]string
	err  error
}

// NewPrograms returns Programs for the module's packages pkgs (such as
// "cmd/reprised"); each is named by its last element in Path.
func NewPrograms(prefix string, pkgs ...string) *Programs {
	return &Programs{prefix: prefix, pkgs: pkgs}
}

func (p *Programs) build() {
	p.dir, p.err = os.MkdirTemp("", p.prefix)
	if p.err != nil {
		return
	}
	p.bins = map[string]string{}
	for _, pkg := range p.pkgs {
		bin := filepath.Join(p.dir, path.Base(pkg))
		out, err := exec.Command("go", "build", "-o", bin, "github.com/reprise-rl/reprise/"+pkg).CombinedOutput()
		if err != nil {
			p.err = fmt.Errorf("building %s: %v\n%s", pkg, err, out)
			return
		}
		p.bins[path.Base(pkg)] = bin
	}
}

// Path builds the programs if no test has yet, and returns the path of the
// one named name.
func (p *Programs) Path(t testing.TB, name string) string {
	t.Helper()
	p.once.Do(p.build)
	if p.err != nil {
		t.Fatal(p.err)
	}
	bin, ok := p.bins[name]
	if !ok {
		t.Fatalf("testutil.Programs: %q is not one of %v", name, p.pkgs)
	}
	return bin
}

// Remove deletes the built programs. Call it from TestMain after m.Run.
func (p *Programs) Remove() {
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}
