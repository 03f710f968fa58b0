package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine says where the figures come from.
type Machine struct {
	CPU       string  `json:"cpu"`
	Cores     int     `json:"cores"`
	MemoryGiB float64 `json:"memory_gib"`
	Kernel    string  `json:"kernel"`
	OS        string  `json:"os"`
	Go        string  `json:"go"`
	// Load averages (1, 5, 15 minutes) when the suite started and ended:
	// other work on the machine shows here.
	LoadStart [3]float64 `json:"load_start"`
	LoadEnd   [3]float64 `json:"load_end"`
}

func describeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(), LoadStart: loadAvg()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if kb, err := procField("/proc/meminfo", "MemTotal"); err == nil {
		m.MemoryGiB = float64(kb) / (1 << 20)
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	return m
}

func (m Machine) String() string {
	cpu := m.CPU
	if cpu == "" {
		cpu = "unknown CPU"
	}
	return fmt.Sprintf("%s, %d cores, %.0f GiB, %s %s, %s", cpu, m.Cores, m.MemoryGiB, m.OS, m.Kernel, m.Go)
}

// loadAvg reads the load averages; zeros where /proc is missing.
func loadAvg() [3]float64 {
	var l [3]float64
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	for i, f := range strings.Fields(string(data)) {
		if i == len(l) {
			break
		}
		l[i], _ = strconv.ParseFloat(f, 64)
	}
	return l
}

var errNoProc = errors.New("resident memory is read from /proc, which this system lacks")

// procField reads a "Key:   N kB" line from a /proc file, in kB.
func procField(path, key string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, errNoProc
		}
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("no %s in %s", key, path)
}

// rss is the resident memory of process pid, in bytes.
func rss(pid int) (int64, error) {
	kb, err := procField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS")
	return kb << 10, err
}

// settledRSS waits until the resident memory of pid stops moving (within
// 1% over four readings 250 ms apart) or limit passes, and returns it:
// the Go runtime returns freed memory and JetStream drops its caches a
// little after a burst of work.
func settledRSS(ctx context.Context, pid int, limit time.Duration) (int64, error) {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	prev, err := rss(pid)
	if err != nil {
		return 0, err
	}
	steady := 0
	for steady < 4 && time.Now().Before(deadline) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		cur, err := rss(pid)
		if err != nil {
			return 0, err
		}
		if diff := cur - prev; diff*100 <= prev && -diff*100 <= prev {
			steady++
		} else {
			steady = 0
		}
		prev = cur
	}
	return prev, nil
}
