#!/usr/bin/env bash
# Fresh machine -> trained model: creates .venv, installs mxtrain, trains the default
# experiment (configs/ptb_lstm.yaml) on the real Penn Treebank text for a short run.
# Extra arguments are passed to `mxtrain fit`, e.g. scripts/quickstart.sh --set fit.num_epoch=5
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# an explicit (empty) extras argument: a sourced file would otherwise see our own arguments
source "$ROOT/scripts/_venv.sh" ""
cd "$ROOT"
.venv/bin/mxtrain --version
.venv/bin/mxtrain fit configs/ptb_lstm.yaml --name ptb_lstm_quickstart --force \
  --set fit.num_epoch=1 "$@"
