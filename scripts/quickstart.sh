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
# One epoch of the default model: dropout regularises over many epochs but only slows the
# first, and quartering the learning rate for the epoch's last quarter lets the weights settle
# before the validation pass (the full run's cosine schedule does that over 10 epochs).
.venv/bin/mxtrain fit configs/ptb_lstm.yaml --name ptb_lstm_quickstart --force \
  --set fit.num_epoch=1 --set model.dropout=0 \
  --set 'optimizer.lr_scheduler={type: multifactor, unit: epochs, steps: [0.75], factor: 0.25}' \
  "$@"
