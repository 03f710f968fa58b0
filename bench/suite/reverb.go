package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// defaultVenv is where bench/reverb/setup.sh puts Reverb's virtual
// environment unless told otherwise.
func defaultVenv() string {
	if v := os.Getenv("REPRISE_REVERB_VENV"); v != "" {
		return v
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "reprise-bench", "reverb-venv")
}

// reverbSpec tells bench/reverb/driver.py what to run: the same
// workloads as the Go side, with the same sizes and durations.
type reverbSpec struct {
	Payloads    []int          `json:"payloads"`
	Clients     []int          `json:"clients"`
	WarmupSec   float64        `json:"warmup_sec"`
	DurationSec float64        `json:"duration_sec"`
	InsertBatch map[string]int `json:"insert_batch"`
	SampleBatch map[string]int `json:"sample_batch"`
	TableSize   map[string]int `json:"table_size"`
	Mixed       reverbMixed    `json:"mixed"`
	Latency     reverbLatency  `json:"latency"`
	Memory      []memorySeries `json:"memory"`
	SettleSec   float64        `json:"settle_sec"`
}

type reverbMixed struct {
	Payload          int     `json:"payload"`
	Clients          []int   `json:"clients"`
	Batch            int     `json:"batch"`
	SamplesPerInsert float64 `json:"samples_per_insert"`
	MinSize          int     `json:"min_size"`
	ErrorBuffer      float64 `json:"error_buffer"`
	MaxSize          int     `json:"max_size"`
}

type reverbLatency struct {
	Payload     int     `json:"payload"`
	DurationSec float64 `json:"duration_sec"`
	Inserts     int     `json:"inserts"`
}

func (s *suite) reverbSpec() reverbSpec {
	p := s.plan
	spec := reverbSpec{
		Payloads: p.payloads, Clients: p.clients,
		WarmupSec: p.warmup.Seconds(), DurationSec: p.duration.Seconds(),
		InsertBatch: map[string]int{}, SampleBatch: map[string]int{}, TableSize: map[string]int{},
		Mixed: reverbMixed{Payload: p.mixedPayload, Clients: p.mixedClients, Batch: p.mixedBatch,
			SamplesPerInsert: mixedSamplesPerInsert, MinSize: mixedMinSize, ErrorBuffer: mixedErrorBuffer, MaxSize: mixedMaxSize},
		Latency:   reverbLatency{Payload: 400, DurationSec: p.latencyPoint.Seconds(), Inserts: p.latencyInserts},
		Memory:    p.memory,
		SettleSec: p.settle.Seconds(),
	}
	for _, payload := range append(p.payloads, p.mixedPayload, 400) {
		key := strconv.Itoa(payload)
		spec.InsertBatch[key], spec.SampleBatch[key], spec.TableSize[key] = insertBatch(payload), sampleBatch(payload), tableSize(payload)
	}
	return spec
}

// runReverb runs the Reverb driver in its virtual environment and adds
// its results. A missing or broken environment is reported in the
// results, not fatal: Reverb is the other side of a comparison.
func (s *suite) runReverb(ctx context.Context) error {
	python := filepath.Join(s.opts.venv, "bin", "python")
	s.res.Reverb.Venv = s.opts.venv
	if _, err := os.Stat(python); err != nil {
		s.res.Reverb.Error = fmt.Sprintf("no virtual environment at %s (%v): create it with bash bench/reverb/setup.sh", s.opts.venv, err)
		s.log.Warn("skipping Reverb", "reason", s.res.Reverb.Error)
		return nil
	}
	specPath := filepath.Join(s.work, "reverb-spec.json")
	data, err := json.MarshalIndent(s.reverbSpec(), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(specPath, data, 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(s.work, "reverb.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	driver := filepath.Join(s.repo, "bench", "reverb", "driver.py")
	dctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	cmd := exec.CommandContext(dctx, python, driver, "--spec", specPath)
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "PYTHONUNBUFFERED=1")
	cmd.Stderr = logFile
	// The driver runs each Reverb server in a child process, which holds
	// the driver's stdout too: a hang is ended by killing the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	s.log.Info("running Reverb", "driver", driver, "log", logPath)
	if err := cmd.Start(); err != nil {
		s.res.Reverb.Error = fmt.Sprintf("%s %s: %v", python, driver, err)
		return nil
	}
	quiet := time.AfterFunc(s.plan.reverbQuiet, func() { stop(errReverbQuiet) })
	readErr := s.readReverb(stdout, func() { quiet.Reset(s.plan.reverbQuiet) })
	quiet.Stop()
	waitErr := cmd.Wait()
	if err := errors.Join(readErr, waitErr); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if cause := context.Cause(dctx); errors.Is(cause, errReverbQuiet) {
			err = fmt.Errorf("%w (silent for %v)", cause, s.plan.reverbQuiet)
		}
		s.res.Reverb.Error = fmt.Sprintf("%s %s --spec %s: %v\n%s", python, driver, specPath, err, tail(logPath))
		s.log.Warn("Reverb driver failed", "error", err, "log", logPath)
		return nil
	}
	s.res.Reverb.Ran = true
	return nil
}

// reverbQuiet is how long the Reverb driver may print nothing before the
// suite takes it for hung: its longest step, filling 100,000 items of 4 kB
// for the memory section, prints within a minute here. Reverb's writers
// and a rate limiter have waited on each other for good (2026-11-28, the
// mixed section), silently, as its users also see.
const reverbQuiet = 3 * time.Minute

// errReverbQuiet is the cause of stopping a driver that printed nothing
// for the plan's reverbQuiet.
var errReverbQuiet = errors.New("the Reverb driver printed nothing for too long: hung, and stopped; what it measured before is kept")

// readReverb decodes the driver's output: one JSON object per line, each
// with a "kind". alive is called on every line.
func (s *suite) readReverb(r io.Reader, alive func()) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		alive()
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var head struct {
			Kind    string `json:"kind"`
			Version string `json:"version"`
		}
		if err := json.Unmarshal([]byte(line), &head); err != nil {
			return fmt.Errorf("reading the Reverb driver's output %q: %w", line, err)
		}
		var err error
		switch head.Kind {
		case "version":
			s.res.Reverb.Version = head.Version
		case "throughput":
			var p Point
			if err = json.Unmarshal([]byte(line), &p); err == nil {
				p.System = sysReverb
				s.res.Throughput = append(s.res.Throughput, p)
				s.log.Info("reverb", "mode", p.Mode, "payload", p.Payload, "clients", p.Clients, "items/s", si(p.ItemsPerSec), "bytes/s", si(p.BytesPerSec))
			}
		case "mixed":
			var m Mixed
			if err = json.Unmarshal([]byte(line), &m); err == nil {
				// Reverb's flush returns once the table took the items.
				m.System, m.AppliedPerSec = sysReverb, m.InsertItemsPerSec
				s.res.Mixed = append(s.res.Mixed, m)
			}
		case "latency":
			var l Latency
			if err = json.Unmarshal([]byte(line), &l); err == nil {
				l.System = sysReverb
				s.res.Latency = append(s.res.Latency, l)
			}
		case "memory":
			var m MemoryPoint
			if err = json.Unmarshal([]byte(line), &m); err == nil {
				m.System = sysReverb
				s.res.Memory = append(s.res.Memory, m)
			}
		default:
			s.log.Warn("Reverb driver: output of unknown kind", "line", line)
		}
		if err != nil {
			return fmt.Errorf("reading the Reverb driver's %s line %q: %w", head.Kind, line, err)
		}
	}
	return sc.Err()
}
