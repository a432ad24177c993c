#!/usr/bin/env bash
# Creates .venv, installs mxtrain with its test extras, then runs lint, types and the whole
# test suite. Extra arguments go to pytest, e.g. scripts/test.sh -k config
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_venv.sh" "[test]"
cd "$ROOT"
# One OpenMP thread per MXNet process keeps the suite predictable on small CI machines.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "== ruff"
.venv/bin/ruff check mxtrain tests scripts
.venv/bin/ruff format --check mxtrain tests scripts
echo "== mypy"
.venv/bin/mypy mxtrain
echo "== pytest"
# One pytest worker per usable core (nproc follows taskset; MXTRAIN_TEST_WORKERS overrides),
# each test file on one worker so its module fixtures are built once.
# (nproc also obeys OMP_NUM_THREADS, set to 1 above: ask it without)
WORKERS="${MXTRAIN_TEST_WORKERS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"
PARALLEL=()
if [ "$WORKERS" -gt 1 ]; then
  PARALLEL=(-n "$WORKERS" --dist loadfile)
fi
# --durations: the slowest tests in every log, so the suite's time is watched where it runs
.venv/bin/python -m pytest -q --durations=15 "${PARALLEL[@]}" "$@"
