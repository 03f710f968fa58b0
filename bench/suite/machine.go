package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
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
	// One core's speed when the suite started and ended. A shared VM's
	// moves from hour to hour, and with it the ratio of Reprise, bound by
	// its CPU, to raw JetStream's baselines, bound more by bytes and
	// syscalls: runs compare only at like speeds.
	SpeedStart Speed `json:"speed_start"`
	SpeedEnd   Speed `json:"speed_end"`
}

// Speed is one core's pace at two kinds of work.
type Speed struct {
	// SHA256MBps hashes a buffer that stays in the cache: the core alone.
	SHA256MBps float64 `json:"sha256_mb_per_sec"`
	// CopyGBps copies a buffer larger than any cache: the core and the
	// memory it shares.
	CopyGBps float64 `json:"copy_gb_per_sec"`
	// MissNs is one read of a chain of reads at random places in a
	// buffer larger than any cache, each waiting for the one before: what
	// a cache miss costs, as the apply loop and the sampler pay it on
	// tables' entries and chunks.
	MissNs float64 `json:"miss_ns"`
}

func (s Speed) String() string {
	return fmt.Sprintf("SHA-256 %.0f MB/s, copying %.1f GB/s, a cache miss %.0f ns", s.SHA256MBps, s.CopyGBps, s.MissNs)
}

// measureSpeed times each kind of work five times and keeps the fastest:
// the slower tries are the ones other work interrupted.
func measureSpeed() Speed {
	const tries = 5
	small := make([]byte, 1<<20)
	src, dst := make([]byte, 64<<20), make([]byte, 64<<20)
	// Write every page of both before timing: pages never written read
	// as one shared page of zeros, which stays in the cache.
	for i := 0; i < len(src); i += 4096 {
		src[i] = byte(i >> 12)
	}
	copy(dst, src)
	// One cycle through every element (Sattolo's shuffle), so that the
	// chain of reads never settles in a short loop the cache holds.
	chain := make([]uint32, len(src)/4)
	for i := range chain {
		chain[i] = uint32(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := len(chain) - 1; i > 0; i-- {
		j := rng.IntN(i)
		chain[i], chain[j] = chain[j], chain[i]
	}
	const reads = 1 << 19
	var at uint32
	s := Speed{MissNs: math.Inf(1)}
	for range tries {
		start := time.Now()
		for range 16 {
			sha256.Sum256(small)
		}
		s.SHA256MBps = max(s.SHA256MBps, 16*float64(len(small))/time.Since(start).Seconds()/1e6)
		start = time.Now()
		copy(dst, src)
		s.CopyGBps = max(s.CopyGBps, float64(len(src))/time.Since(start).Seconds()/1e9)
		start = time.Now()
		for range reads {
			at = chain[at]
		}
		s.MissNs = min(s.MissNs, float64(time.Since(start).Nanoseconds())/reads)
	}
	return s
}

func describeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(), LoadStart: loadAvg(), SpeedStart: measureSpeed()}
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
