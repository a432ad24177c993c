#!/usr/bin/env bash
# Creates .venv-peer: Sockeye 1.18.106 (the last Sockeye on MXNet's module API) beside MXNet
# 1.9.1 on Python 3.11, for the side-by-side benchmark (scripts/bench_seq2seq.py, issue 30).
# It is a separate environment because Sockeye 1.18 needs sacrebleu 1.x while mxtrain uses 2.x.
# With the versions below, nothing in Sockeye needed a change on Python 3.11.7: sockeye.train
# (RNN encoder/decoder with attention, word and sentence batches, checkpoints, the checkpoint
# decoder child process with sacrebleu's BLEU/chrF) and sockeye.translate at beam 5 ran as
# they are; what would break is the version pins, explained at each install below.
# Usage: scripts/peer_env.sh            (idempotent: reinstalls nothing that is already there)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
PEER="$ROOT/.venv-peer"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "error: the peer environment needs Python 3.11 (mxnet 1.9.1 wheels); found $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 2
fi
if [ ! -x "$PEER/bin/python" ]; then
  "$PYTHON" -m venv "$PEER"
fi
PIP=("$PEER/bin/python" -m pip install --quiet)
# Sockeye 1.18.106's own pins cannot be met on Python 3.11: mxnet-mkl==1.4.1 has no wheel for
# it. Its code runs on MXNet 1.9.1 (same module API; its MKL-DNN build is the default wheel).
# NumPy must stay below 1.24: sockeye saves its data iterator's state at every checkpoint with
# np.save of a list of permutations of different lengths (data_io.py), a ragged array that
# NumPy 1.24 refuses (ValueError; 1.23 only warns VisibleDeprecationWarning), and MXNet 1.9.1
# itself does not import on 1.24 (mxnet/numpy/utils.py: `bool = onp.bool`, removed in 1.24).
"${PIP[@]}" "mxnet==1.9.1" "numpy<1.24"
# What sockeye 1.18 imports at the top of train/translate: portalocker (device locks), pyyaml
# (model config), sacrebleu 1.x: raw_corpus_bleu and CHRF_BETA, which it calls, left in
# sacrebleu 2.0. sacrebleu 1.3.6 goes in without its dependencies: its only one is the PyPI
# "typing" backport, which has no business in a Python 3.11 environment (it can shadow the
# standard library's typing for tools that put site-packages first).
"${PIP[@]}" "portalocker" "pyyaml"
"${PIP[@]}" --no-deps "sacrebleu==1.3.6" "sockeye==1.18.106"
"$PEER/bin/python" - <<'CHECK'
import importlib.util
import sockeye.train, sockeye.translate  # noqa: E401  the two entry points the benchmark runs
assert importlib.util.find_spec("typing").origin.startswith(__import__("sysconfig").get_paths()["stdlib"])
print("sockeye", __import__("sockeye").__version__, "imports")
CHECK
