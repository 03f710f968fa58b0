// Command gohelper is the Go side of the Python integration tests: a Go
// producer whose data the Python sampler checks, and a Go consumer that
// dumps what the Python writer wrote. pytest builds and runs it
// (python/tests/conftest.py).
//
//	gohelper produce --nats URL --table T --episodes 5 --steps 20 --length 3 --chunk-length 4 --compression zstd
//	gohelper consume --nats URL --table T --distinct 40
//	gohelper auth-server --listen 127.0.0.1:PORT --store DIR --user U --password P
//
// produce writes, for episode e and step t, obs = [e, t, e*1000+t, -t]
// (float32), action = e*1000+t (int64) and frame = (e+t)%256 everywhere
// (uint8 [4, 4]), items of the last --length steps, then prints one JSON
// line {"items": N}. consume samples until it has seen --distinct items and
// prints them as JSON: key and, per column, dtype, shape and base64 bytes.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gohelper produce|consume [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "produce":
		err = produce(os.Args[2:])
	case "consume":
		err = consume(os.Args[2:])
	case "auth-server":
		err = authServer(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gohelper:", err)
		os.Exit(1)
	}
}

func connect(url string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Name("reprise-gohelper"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
}

func produce(args []string) error {
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	url := fs.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	prefix := fs.String("prefix", broker.DefaultPrefix, "subject prefix")
	table := fs.String("table", "replay", "table")
	episodes := fs.Int("episodes", 5, "episodes")
	steps := fs.Int("steps", 20, "steps per episode")
	length := fs.Int("length", 3, "steps per item")
	chunkLength := fs.Int("chunk-length", 4, "steps per chunk")
	compression := fs.String("compression", "zstd", "zstd, s2 or none")
	delta := fs.Bool("delta", true, "delta-encode integer columns")
	if err := fs.Parse(args); err != nil {
		return err
	}
	codec := map[string]wire.Codec{"zstd": wire.Zstd, "s2": wire.S2, "none": wire.Uncompressed}[*compression]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := connect(*url)
	if err != nil {
		return err
	}
	defer nc.Close()
	p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(*prefix), broker.WithChunkLength(*chunkLength),
		broker.WithCompression(codec), broker.WithDelta(*delta))
	if err != nil {
		return err
	}
	items := 0
	for e := range *episodes {
		for t := range *steps {
			id := int64(e*1000 + t)
			frame := make([]uint8, 16)
			for i := range frame {
				frame[i] = uint8((e + t) % 256)
			}
			step := broker.Step{
				"obs":    broker.Float32s([]int64{4}, []float32{float32(e), float32(t), float32(id), float32(-t)}),
				"action": broker.Int64s(nil, []int64{id}),
				"frame":  broker.Uint8s([]int64{4, 4}, frame),
			}
			if err := p.Append(ctx, step); err != nil {
				return err
			}
			if t+1 >= *length {
				if err := p.CreateItem(ctx, *table, 1, broker.Last(*length, "obs", "action", "frame")); err != nil {
					return err
				}
				items++
			}
		}
		if err := p.EndEpisode(ctx); err != nil {
			return err
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		return err
	}
	if err := p.Close(ctx); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]int{"items": items})
}

type tensorJSON struct {
	Dtype string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Raw   []byte  `json:"raw"`
}

type itemJSON struct {
	Key      uint64                `json:"key"`
	Priority float64               `json:"priority"`
	Columns  map[string]tensorJSON `json:"columns"`
	Order    []string              `json:"order"`
}

func consume(args []string) error {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	url := fs.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	prefix := fs.String("prefix", broker.DefaultPrefix, "subject prefix")
	table := fs.String("table", "replay", "table")
	distinct := fs.Int("distinct", 10, "distinct items to collect")
	batch := fs.Int("batch", 64, "items per request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := connect(*url)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := broker.NewClient(nc, broker.WithPrefix(*prefix))
	if err != nil {
		return err
	}
	seen := map[uint64]itemJSON{}
	var order []uint64
	for len(seen) < *distinct {
		samples, err := c.Sample(ctx, *table, *batch)
		if err != nil {
			return err
		}
		for _, s := range samples {
			if _, ok := seen[s.Info.Key]; ok {
				continue
			}
			it := itemJSON{Key: s.Info.Key, Priority: s.Info.Priority, Columns: map[string]tensorJSON{}}
			for _, col := range s.Columns {
				it.Columns[col.Name] = tensorJSON{Dtype: col.Tensor.DType, Shape: col.Tensor.Shape, Raw: col.Tensor.Data}
				it.Order = append(it.Order, col.Name)
			}
			seen[s.Info.Key] = it
			order = append(order, s.Info.Key)
		}
	}
	out := make([]itemJSON, 0, len(order))
	for _, k := range order {
		out = append(out, seen[k])
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// authServer runs a NATS server with JetStream that only lets in the given
// user, so that the Python client's user/password options meet a real
// server (reprised then runs against it with --nats). It prints "ready"
// and serves until it gets SIGTERM.
func authServer(args []string) error {
	fs := flag.NewFlagSet("auth-server", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:-1", "HOST:PORT")
	store := fs.String("store", "", "JetStream directory")
	user := fs.String("user", "", "user")
	password := fs.String("password", "", "password")
	if err := fs.Parse(args); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(*listen)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	s, err := server.NewServer(&server.Options{Host: host, Port: p, JetStream: true, StoreDir: *store,
		Username: *user, Password: *password, NoSigs: true})
	if err != nil {
		return err
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		return fmt.Errorf("server not ready")
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Shutdown()
	return nil
}
