#!/usr/bin/env bash
# Install the gateway (core only: no torch) into .venv and serve it on 127.0.0.1:8080.
# With no policy it serves a built-in demo over simulated providers, in memory, with no keys.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
exec .venv/bin/gateway serve "$@"
