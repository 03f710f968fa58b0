#!/usr/bin/env bash
# Runs every test of the repository: the Go tests (go test -race ./...) and
# the Python client's tests (pytest), in a virtualenv at .venv.
#
#   scripts/test.sh                   # everything (CI runs exactly this)
#   scripts/test.sh --python          # only the Python side (a quicker loop)
#   scripts/test.sh --update-golden   # rewrite the golden vectors, then test
#
# Needs Go, Python 3.10+ and protoc 3.21 (installed with apt-get when missing
# and running as root). The first run installs python/ with its test extras
# (pytest, torch, gymnasium) into .venv: about 2 minutes and 5.5 GB, almost
# all of it torch and its CUDA libraries (pip keeps no cache of the wheels:
# they would take another 3 GB).
set -euo pipefail
cd "$(dirname "$0")/.."

python_only=0
update_golden=0
for arg in "$@"; do
  case "$arg" in
    --python) python_only=1 ;;
    --update-golden) update_golden=1 ;;
    *) echo "test.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "test.sh: need Python 3.10 or newer (set PYTHON=...)" >&2
  exit 1
fi

if ! command -v protoc >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing protoc (apt-get install protobuf-compiler)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null
fi
echo "== python protobuf code matches broker/wire/reprise.proto"
scripts/gen-python-proto.sh --check

echo "== virtualenv .venv with python/[test]"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir -e "./python[test]"

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
echo "== building reprised, reprisectl and the Go test helper"
go build -o "$bin/reprised" ./cmd/reprised
go build -o "$bin/reprisectl" ./cmd/reprisectl
go build -o "$bin/gohelper" ./python/tests/gohelper

if [ "$update_golden" = 1 ]; then
  echo "== rewriting golden vectors (python/tests/golden)"
  go test ./broker/service -run TestGoldenGoVectors -update -count=1
  (cd python && REPRISE_UPDATE_GOLDEN=1 ../.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_golden.py)
fi

echo "== mypy (python/reprise)"
(cd python && ../.venv/bin/python -m mypy reprise)

echo "== pytest"
set +e
(cd python && REPRISE_BIN_DIR="$bin" REPRISE_REQUIRE_TORCH=1 REPRISE_REQUIRE_JAX=1 ../.venv/bin/python -m pytest -q -p no:cacheprovider tests)
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
elif [ "$rc" != 0 ]; then
  exit "$rc"
fi

if [ "$python_only" = 1 ]; then
  exit 0
fi
echo "== go test -race ./..."
go test -race ./...

# Each fuzz target searches briefly past its checked-in corpus (which the
# run above replays); FUZZTIME=10m searches longer. The default is a count
# of inputs, not a duration: Go 1.26's fuzz coordinator can fail a
# duration-bound run with a bare "context deadline exceeded" when a worker
# is mid-input at the deadline on a busy machine (go.dev/issue/75804, fixed
# in Go 1.27), which no input causes and no rerun reproduces.
fuzztime=${FUZZTIME:-50000x}
for target in ./broker/service:FuzzApply ./broker/service:FuzzParseInsertBatch ./broker/service:FuzzReadCheckpoint ./broker/wire:FuzzDecodeChunk ./broker/wire:FuzzRoundTrip \
  ./broker/wire:FuzzDecodeSampleResponse ./tables:FuzzTable ./limiter:FuzzLimiter ./selectors:FuzzSelectors; do
  echo "== fuzz ${target#*:} for $fuzztime"
  go test -run - -fuzz "^${target#*:}\$" -fuzztime "$fuzztime" "${target%%:*}"
done
