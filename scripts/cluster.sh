#!/usr/bin/env bash
# Starts a three-node NATS cluster with JetStream on this machine, for
# trying Reprise replicated: three nats-server processes built from the
# nats-server module in go.mod (no download beyond the Go module cache),
# listening on loopback, each with its own store. It prints the --nats URL
# list for reprised and its clients, and stops the servers on Ctrl-C.
#
#   scripts/cluster.sh                 # clients on 4222-4224, routes on 6222-6224, monitoring on 8222-8224
#   PORT_OFFSET=100 scripts/cluster.sh # clients on 4322-4324, and so on
#   DATA=/var/tmp/rc scripts/cluster.sh
#
# Then, in another terminal (examples/deploy/reprise.yaml puts the stream
# and the checkpoint bucket at 3 replicas):
#
#   go run ./cmd/reprised --config examples/deploy/reprise.yaml --nats <the URL list>
#
# Kill a node to see the cluster carry on: kill -9 <its pid, printed below>;
# then run this script's restart line for it (printed too), or restart the
# whole cluster: its data stays in $DATA between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

offset=${PORT_OFFSET:-0}
data=${DATA:-./reprise-cluster}
mkdir -p "$data"
data=$(cd "$data" && pwd)

bin="$data/bin/nats-server"
echo "== building nats-server $(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2) into $bin"
go build -o "$bin" github.com/nats-io/nats-server/v2

routes=""
for i in 1 2 3; do
  routes+="${routes:+, }nats-route://127.0.0.1:$((6221 + i + offset))"
done

pids=()
urls=""
stop() {
  trap - INT TERM EXIT
  echo
  echo "== stopping the cluster"
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  wait
}
trap stop INT TERM EXIT

for i in 1 2 3; do
  dir="$data/n$i"
  mkdir -p "$dir"
  cat >"$dir/nats-server.conf" <<EOF
server_name: n$i
host: 127.0.0.1
port: $((4221 + i + offset))
http_port: $((8221 + i + offset))
jetstream {
  store_dir: "$dir/jetstream"
}
cluster {
  name: reprise
  listen: 127.0.0.1:$((6221 + i + offset))
  routes: [$routes]
}
EOF
  "$bin" -c "$dir/nats-server.conf" >>"$dir/nats-server.log" 2>&1 &
  pids+=($!)
  urls+="${urls:+,}nats://127.0.0.1:$((4221 + i + offset))"
done

# /healthz answers 200 once the node serves JetStream, which in a cluster
# needs an elected meta leader.
echo "== waiting for JetStream on every node"
for i in 1 2 3; do
  for _ in $(seq 300); do
    if curl -fsS "http://127.0.0.1:$((8221 + i + offset))/healthz" >/dev/null 2>&1; then
      break
    fi
    if ! kill -0 "${pids[$((i - 1))]}" 2>/dev/null; then
      echo "cluster.sh: n$i exited; see $data/n$i/nats-server.log" >&2
      exit 1
    fi
    sleep 0.1
  done
done

cat <<EOF

NATS cluster is up (JetStream data and logs in $data).
  --nats $urls

  go run ./cmd/reprised --config examples/deploy/reprise.yaml --nats $urls
  go run ./examples/actorlearner --nats $urls

Nodes:
EOF
for i in 1 2 3; do
  echo "  n$i  pid ${pids[$((i - 1))]}  restart: $bin -c $data/n$i/nats-server.conf"
done
echo
echo "Stop it with Ctrl-C."
wait
