package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// Cluster is a JetStream cluster of nats-server processes on loopback, each
// with its own store, fully routed to the others. Each node can be killed
// and restarted on its ports and store while the others go on.
type Cluster struct {
	nodes []*Process
}

// StartCluster starts n nats-server processes named n1, n2, ... in one
// cluster and returns once every node answers JetStream requests, which
// needs an elected meta leader. Options apply to every node, except
// WithPort and WithStoreDir, which the cluster picks per node. The
// processes are killed when the test ends; their output is logged if the
// test failed.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: a cluster of %d nodes", n)
	}
	bin := Binary(t)
	// Every node lists every node's route, itself included (the server
	// skips it): a node that restarts finds the others whichever of them
	// is up, and each node counts n peers for the meta group from the
	// start, so no leader is elected by fewer than a majority of n.
	ports := freePorts(t, 2*n)
	clientPorts, routePorts := ports[:n], ports[n:]
	routes := make([]string, n)
	for i, port := range routePorts {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", port)
	}
	c := &Cluster{}
	for i := range n {
		p := &Process{bin: bin}
		for _, opt := range opts {
			opt(&p.cfg)
		}
		p.cfg.port = clientPorts[i]
		p.cfg.storeDir = t.TempDir()
		p.cfg.name = fmt.Sprintf("n%d", i+1)
		p.cfg.cluster = fmt.Sprintf("cluster {\n  name: natstest\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n",
			routePorts[i], strings.Join(routes, ", "))
		c.nodes = append(c.nodes, p)
		t.Cleanup(func() {
			p.Kill()
			if t.Failed() {
				t.Logf("nats-server %s output:\n%s", p.cfg.name, p.output.String())
			}
		})
	}
	deadline := time.Now().Add(readyTimeout)
	for _, p := range c.nodes {
		p.spawn(t, p.cfg.port, deadline)
	}
	for _, p := range c.nodes {
		p.awaitJetStream(t, deadline)
	}
	return c
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// They are held open together so that no two are the same; another
// process could take one before the server binds it, which on loopback in a
// test is rare enough.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("natstest: %v", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// Nodes returns the cluster's processes, in name order.
func (c *Cluster) Nodes() []*Process { return c.nodes }

// Node returns the process with the given server name (as JetStream
// reports it, e.g. in a stream's cluster leader), or nil.
func (c *Cluster) Node(name string) *Process {
	for _, p := range c.nodes {
		if p.cfg.name == name {
			return p
		}
	}
	return nil
}

// URLs returns every node's client URL.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i, p := range c.nodes {
		urls[i] = p.URL()
	}
	return urls
}

// URL returns the client URLs comma-separated, as nats.Connect and
// reprised's --nats take them: a client connected to a node that dies
// reconnects to another.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// Name returns the server name, "" outside a cluster.
func (p *Process) Name() string { return p.cfg.name }
