#!/usr/bin/env bash
# Regenerates python/reprise/_proto/reprise_pb2.py from broker/wire/reprise.proto
# with protoc 3.21 (Debian's protobuf-compiler, the one the Go side uses).
#
#   scripts/gen-python-proto.sh           # rewrite the generated file
#   scripts/gen-python-proto.sh --check   # fail if it is out of date
set -euo pipefail
cd "$(dirname "$0")/.."
want="libprotoc 3.21."
have=$(protoc --version 2>/dev/null || true)
if [[ "$have" != "$want"* ]]; then
  echo "gen-python-proto: need protoc 3.21.x (apt-get install protobuf-compiler), found: ${have:-none}" >&2
  exit 1
fi
out=python/reprise/_proto
if [[ "${1:-}" == "--check" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  protoc -Ibroker/wire --python_out="$tmp" --pyi_out="$tmp" broker/wire/reprise.proto
  if ! cmp -s "$tmp/reprise_pb2.py" "$out/reprise_pb2.py" || ! cmp -s "$tmp/reprise_pb2.pyi" "$out/reprise_pb2.pyi"; then
    echo "gen-python-proto: $out/reprise_pb2.py does not match broker/wire/reprise.proto; run scripts/gen-python-proto.sh" >&2
    exit 1
  fi
  echo "gen-python-proto: $out/reprise_pb2.py is up to date"
  exit 0
fi
protoc -Ibroker/wire --python_out="$out" --pyi_out="$out" broker/wire/reprise.proto
echo "gen-python-proto: wrote $out/reprise_pb2.py"
