#!/usr/bin/env bash
# Creates the virtual environment the Reverb driver runs in: DeepMind's
# dm-reverb 0.14.0 (the last release with Linux wheels, cp311 manylinux) and
# the TensorFlow it is built against (~=2.15.0), from PyPI.
#
#   bash bench/reverb/setup.sh [VENV_DIR]
#
# VENV_DIR defaults to $REPRISE_REVERB_VENV, else ~/.cache/reprise-bench/reverb-venv
# (outside the repository: TensorFlow is over 1 GB). The suite finds it there
# with --reverb.
set -euo pipefail

venv="${1:-${REPRISE_REVERB_VENV:-$HOME/.cache/reprise-bench/reverb-venv}}"
python="${PYTHON:-python3.11}"

if ! command -v "$python" >/dev/null; then
	echo "setup.sh: $python not found: dm-reverb 0.14.0 ships wheels for CPython 3.11 only; set PYTHON to a 3.11 interpreter" >&2
	exit 1
fi
if [[ "$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "3.11" ]]; then
	echo "setup.sh: $python is not CPython 3.11, which dm-reverb 0.14.0 needs" >&2
	exit 1
fi

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet 'dm-reverb[tensorflow]==0.14.0' 'tensorflow~=2.15.0' 'numpy<2'
# Importing reverb loads its C++ extension against TensorFlow's: this is
# where a broken install shows.
TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -c 'import importlib.metadata as m, reverb, tensorflow; print("dm-reverb", m.version("dm-reverb"), "tensorflow", tensorflow.__version__)'
echo "Reverb venv ready: $venv"
