// Command profile runs one of the suite's workloads with the NATS server,
// the table service and the clients in one process, and writes a CPU
// profile of all of them: the view pprof needs to find where a workload's
// time goes. The server and service are set up as reprised sets them up
// (embedded server with file storage, one table service); the clients
// connect over loopback TCP as reprisectl's do.
//
//	go run ./bench/profile --mode sample --payload 400 --batch 256 --clients 4 --cpu /tmp/sample.pprof
//	go tool pprof -top /tmp/sample.pprof
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/internal/load"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

func main() {
	var (
		mode     = flag.String("mode", "insert", "workload: insert or sample")
		payload  = flag.Int("payload", 400, "`bytes` of random float32s per item")
		batch    = flag.Int("batch", 64, "items per insert flush or per sample request")
		clients  = flag.Int("clients", 4, "concurrent clients, each with its own connection")
		warmup   = flag.Duration("warmup", time.Second, "time before measuring and profiling")
		duration = flag.Duration("duration", 5*time.Second, "time measured and profiled")
		fill     = flag.Int("fill", 10000, "items inserted before a sample run")
		cpu      = flag.String("cpu", "cpu.pprof", "`file` for the CPU profile")
		heap     = flag.String("heap", "", "`file` for a heap profile taken at the end (optional)")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *mode, *payload, *batch, *clients, *fill, *warmup, *duration, *cpu, *heap); err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, mode string, payload, batch, clients, fill int, warmup, duration time.Duration, cpuPath, heapPath string) error {
	if mode != "insert" && mode != "sample" {
		return fmt.Errorf("--mode %q: want insert or sample", mode)
	}
	dir, err := os.MkdirTemp("", "reprise-profile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(dir), embeddednats.WithListen("127.0.0.1:-1"))
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	nc, err := srv.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	cfg := tables.Config{
		Name:    "bench",
		Sampler: selectors.Options{Kind: selectors.KindUniform},
		Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: int64(min(100000, max(100, (200<<20)/payload))),
		Limiter: limiter.MinSize(1),
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	svc, err := service.New(nc, []tables.Config{cfg}, service.WithLogger(log),
		service.WithStream(service.StreamOptions{MaxBytes: 2 << 30}))
	if err != nil {
		return err
	}
	sctx, stopService := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- svc.Run(sctx) }()
	defer func() {
		stopService()
		<-served
	}()

	if err := waitReady(ctx, nc, served); err != nil {
		return err
	}
	url := srv.ClientURL()
	bc := load.BenchConfig{URL: url, Prefix: broker.DefaultPrefix, Table: cfg.Name, Payload: payload, Batch: batch,
		Compression: wire.Uncompressed, Warmup: warmup, Duration: duration}
	if mode == "insert" {
		bc.Inserters = clients
	} else {
		bc.Samplers = clients
	}
	if mode == "sample" {
		if err := load.Fill(ctx, load.FillConfig{URL: url, Prefix: broker.DefaultPrefix, Table: cfg.Name, Items: fill, Payload: payload, Clients: 2}); err != nil {
			return err
		}
	}
	f, err := os.Create(cpuPath)
	if err != nil {
		return err
	}
	defer f.Close()
	// The profile covers the measured window only.
	profiling := make(chan error, 1)
	go func() {
		select {
		case <-time.After(warmup):
			profiling <- pprof.StartCPUProfile(f)
		case <-ctx.Done():
			profiling <- ctx.Err()
		}
	}()
	res, err := load.Bench(ctx, bc)
	perr := <-profiling
	if perr == nil {
		pprof.StopCPUProfile()
	}
	if err := errors.Join(err, perr); err != nil {
		return err
	}
	t := res.Total
	fmt.Printf("%s: %d clients, %d-byte items, batch %d: %.0f items/s, %.1f MB/s, p50 %.3f ms, p99 %.3f ms\n",
		mode, clients, payload, batch, t.ItemsPerSec, t.BytesPerSec/1e6, t.Latency.P50Ms, t.Latency.P99Ms)
	fmt.Printf("CPU profile: %s (go tool pprof -top %s)\n", cpuPath, cpuPath)
	if heapPath != "" {
		runtime.GC()
		h, err := os.Create(heapPath)
		if err != nil {
			return err
		}
		defer h.Close()
		return pprof.WriteHeapProfile(h)
	}
	return nil
}

// waitReady waits until the service answers an info request, or fails
// with the error Run returned.
func waitReady(ctx context.Context, nc *nats.Conn, served <-chan error) error {
	c, err := broker.NewClient(nc, broker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Info(rctx, "")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case err := <-served:
			return fmt.Errorf("table service stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("table service not ready within 30s: %w", err)
		}
	}
}
