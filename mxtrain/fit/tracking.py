"""``tracking.mlflow``: an MLflow run that follows the mxtrain run.

The run gets the resolved config flattened into parameters (``model.num_hidden``), tags (the
mxtrain and MXNet versions, the commit, the machine, the run folder's path), every number of
every metrics.jsonl record as a metric at the optimizer's update count (``train/perplexity``,
``lr``, ``samples_per_s`` per log interval; ``eval/perplexity`` per evaluation;
``epoch/train/perplexity``, ``epoch/eval/...``, ``epoch/seconds`` per whole epoch: the record of
an epoch cut short by a stop is replaced when the run resumes), and at the end the
best checkpoint's files and the config as artifacts, then its status (FINISHED, KILLED for a
stopped run, FAILED). The run's id is kept in the run folder (``mlflow.json``), so ``mxtrain
resume`` continues the same MLflow run. MLflow is an optional extra (``pip install
'mxtrain[mlflow]'``); a tracking server that stops answering ends the tracking with a warning,
never the training.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mxtrain.config import Config, config_to_dict
from mxtrain.config.schema import MlflowSection
from mxtrain.errors import ConfigError
from mxtrain.fit.run_hooks import RunHook
from mxtrain.plotting import MissingExtraError
from mxtrain.run.atomic import atomic_write_text
from mxtrain.run.folder import RunFolder

log = logging.getLogger("mxtrain")

#: the run folder's file that names the MLflow run a resume continues
MLFLOW_FILE = "mlflow.json"
#: MLflow's longest parameter value (characters) and most values one request may carry
PARAM_VALUE_MAX = 6000
BATCH_MAX = 100
STATUS = {"finished": "FINISHED", "preempted": "KILLED", "interrupted": "KILLED"}


def tracking_uri(cfg: MlflowSection, base_dir: Path) -> str:
    """The URI MLflow is given: a URI with a scheme as written, a plain path taken from the
    config's folder like every path in it."""
    if "://" in cfg.uri or cfg.uri.startswith("file:"):
        return cfg.uri
    return (base_dir / cfg.uri).resolve().as_uri()


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, value text)`` of every leaf of the resolved config."""
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, name + ".")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            yield name, text[:PARAM_VALUE_MAX]


def record_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one metrics.jsonl record under MLflow metric names."""
    event = record.get("event")
    prefix = "epoch/" if event == "epoch" else ""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("event", "epoch", "batch", "time", "checkpoint", "best", "finished"):
            continue
        if isinstance(value, Mapping):
            for name, number in value.items():
                if isinstance(number, int | float) and not isinstance(number, bool):
                    out[f"{prefix}{key}/{name}"] = float(number)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


class MlflowTracker(RunHook):
    """The hook that logs to MLflow, and :meth:`end` that closes the MLflow run."""

    def __init__(self, config: Config, run: RunFolder, module: Any, facts: Mapping[str, Any]):
        cfg = config.tracking.mlflow
        assert cfg is not None
        try:
            from mlflow.entities import Metric, Param  # optional dependency: the [mlflow] extra
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise MissingExtraError(
                "tracking.mlflow needs MLflow, which is not installed in this environment.",
                hint="Install it with `pip install 'mxtrain[mlflow]'`, or remove tracking.mlflow.",
            ) from None
        self.Metric, self.module, self.run = Metric, module, run
        uri = tracking_uri(cfg, config.base_dir)
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store only for those who ask for it: a folder URI is that
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.active = True
        try:
            self._start(config, cfg, uri, facts, Param)
        except Exception as exc:  # MLflow's own errors: the URI, the server, the store
            raise ConfigError(
                f"{config.where('tracking', 'mlflow', 'uri')}: tracking.mlflow could not start "
                f"an MLflow run at {uri}: {exc}",
                hint="Check the URI (a server must be running and reachable), or remove "
                "tracking.mlflow; the run folder keeps what was written.",
            ) from None

    def _start(
        self, config: Config, cfg: MlflowSection, uri: str, facts: Mapping[str, Any], Param: Any
    ) -> None:
        run = self.run
        saved = self._saved_run(uri)
        if saved is not None:
            self.run_id = saved
            self.client.update_run(self.run_id, status="RUNNING")
            log.info("MLflow: continuing run %s at %s", self.run_id, uri)
            return
        experiment = self.client.get_experiment_by_name(cfg.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(cfg.experiment)
        )
        created = self.client.create_run(
            experiment_id, run_name=run.path.name, tags=self._tags(config, facts)
        )
        self.run_id = created.info.run_id
        params = [Param(k, v) for k, v in flat_params(config_to_dict(config))]
        for start in range(0, len(params), BATCH_MAX):
            self.client.log_batch(self.run_id, params=params[start : start + BATCH_MAX])
        atomic_write_text(
            run.path / MLFLOW_FILE,
            json.dumps({"run_id": self.run_id, "tracking_uri": uri}) + "\n",
        )
        log.info("MLflow: run %s in experiment %r at %s", self.run_id, cfg.experiment, uri)

    def _saved_run(self, uri: str) -> str | None:
        """The MLflow run of an earlier part of this run (a resume), if it is at ``uri``."""
        path = self.run.path / MLFLOW_FILE
        if not path.exists():
            return None
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("tracking_uri") != uri:
            log.warning("MLflow: the run was tracked at %s; a new MLflow run starts at %s",
                        saved.get("tracking_uri"), uri)  # fmt: skip
            return None
        return str(saved["run_id"])

    @staticmethod
    def _tags(config: Config, facts: Mapping[str, Any]) -> dict[str, str]:
        git = facts.get("git") or {}
        tags = {
            "mxtrain.version": str(facts.get("mxtrain")),
            "mxtrain.mxnet": str(facts.get("mxnet")),
            "mxtrain.machine": f"{facts.get('cpu')} ({facts.get('isa')}), {facts.get('hostname')}",
            "mxtrain.config": config.source,
        }
        if git.get("commit"):
            tags["mxtrain.commit"] = str(git["commit"])
        return tags

    def _call(self, action: str, *args: Any, **kwargs: Any) -> None:
        if not self.active:
            return
        try:
            getattr(self.client, action)(*args, **kwargs)
        except Exception as exc:  # a tracking server's failure must not end the training
            self.active = False
            log.warning("MLflow: %s failed (%s); tracking stops, training goes on", action, exc)

    def log_record(self, record: Mapping[str, Any]) -> None:
        """One metrics.jsonl record's numbers at the optimizer's update count."""
        step = int(getattr(self.module.optimizer, "num_update", 0) or 0)
        now = int(time.time() * 1000)
        metrics = [self.Metric(k, v, now, step) for k, v in record_metrics(record).items()]
        for start in range(0, len(metrics), BATCH_MAX):
            self._call("log_batch", self.run_id, metrics=metrics[start : start + BATCH_MAX])

    def on_interval(self, record: Any) -> None:
        self.log_record({"event": "interval", "samples_per_s": record.samples_per_s,
                         "tokens_per_s": record.tokens_per_s, "train": record.metrics,
                         "lr": record.lr})  # fmt: skip

    def on_eval(self, epoch: int, batch: int, values: dict[str, float], seconds: float) -> None:
        self.log_record({"event": "eval", "eval": values, "eval_seconds": seconds})

    def on_epoch_record(self, end: Any) -> None:
        # the record of an epoch cut short by a stop is replaced by the whole epoch's when the
        # run resumes (metrics.jsonl is rewritten to the checkpoint), and MLflow keeps every
        # value it is sent: only whole epochs go there
        if not end.entry.get("partial"):
            self.log_record(end.entry)

    def end(self, status: str) -> None:
        """The run folder's path as a tag, the best checkpoint and config as artifacts, and
        the MLflow run's status."""
        self._call("set_tag", self.run_id, "mxtrain.run_folder", str(self.run.path.absolute()))
        best = self.run.path / "checkpoints" / "best"
        beside = ("config.yaml", "model-symbol.json", "vocab.json", "target_vocab.json")
        files = [self.run.path / name for name in beside] + self._checkpoint_files(best)
        for path in files:
            if path.is_file():
                self._call("log_artifact", self.run_id, str(path), "best_checkpoint")
        self._call("set_terminated", self.run_id, status=STATUS.get(status, "FAILED"))

    def _checkpoint_files(self, best: Path) -> list[Path]:
        """The files of the checkpoint ``checkpoints/best`` names (empty without one)."""
        if not best.is_file():
            return []
        tag = best.read_text(encoding="utf-8").strip()
        folder = self.run.path / "checkpoints" / tag
        return sorted(folder.iterdir()) if folder.is_dir() else []
