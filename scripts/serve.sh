#!/usr/bin/env bash
# Install the gateway (core only: no torch; locked dependencies) into .venv and serve it on 127.0.0.1:8080.
# With no policy it serves a built-in demo over simulated providers, in memory, with no keys.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Dependencies at the versions and hashes of requirements.lock (what the image installs), then
# the gateway itself.
.venv/bin/python -m pip install -q --require-hashes -r requirements.lock
.venv/bin/python -m pip install -q --no-deps -e .
exec .venv/bin/gateway serve "$@"
