"""The ``mxtrain`` command group: the group, its epilog, and the registration of every command.

MXNet is imported lazily inside commands, so ``mxtrain --help`` and ``mxtrain check``
answer quickly.
"""

from __future__ import annotations

import click

from mxtrain import __version__
from mxtrain.cli import (
    check,
    diff,
    export,
    fit,
    init,
    kernels,
    launch,
    listing,
    lr_find,
    plot,
    predict,
    resume,
    runs,
    score,
    show,
    sweep,
)

EPILOG = """\b
Examples:
  mxtrain fit configs/ptb_lstm.yaml
  mxtrain fit configs/ptb_lstm.yaml --set optimizer.learning_rate=0.5 --set fit.num_epoch=2
  mxtrain resume runs/ptb_lstm
  mxtrain score runs/ptb_lstm
  mxtrain predict --checkpoint runs/ptb_lstm --input sents.txt --output preds.jsonl
  mxtrain export runs/ptb_lstm:best -o exported/ --format onnx
  mxtrain check configs/ptb_lstm.yaml --explain
  mxtrain launch -n 2 -s 1 cfg.yaml --set kvstore.type=dist_sync
  mxtrain kernels --measure configs/ptb_lstm.yaml
  mxtrain list models
  mxtrain init --template tagger -o tagger.yaml
  mxtrain runs
  mxtrain show runs/ptb_lstm
  mxtrain diff runs/ptb_lstm runs/ptb_gru
  mxtrain plot runs/ptb_lstm runs/ptb_gru --metric perplexity -o curves.png
  mxtrain lr-find configs/ptb_lstm.yaml -o lr.png
  mxtrain sweep configs/ptb_lstm.yaml --grid model.dropout=0.2,0.4 --parallel 2

Shell completion (bash): eval "$(_MXTRAIN_COMPLETE=bash_source mxtrain)"

Exit codes: 0 done, 1 internal error, 2 config/usage error or a plugin's failure,
3 data error,
4 training diverged, 5 run folder problem, 6 sweep: some points failed,
70 distributed job stuck (watchdog),
71 launch: a process of the job was killed or a server/scheduler failed,
75 preempted (resumable), 130 interrupted.
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(__version__, prog_name="mxtrain")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Train, evaluate and serve Apache MXNet models from YAML experiment files."""
    ctx.obj = {"debug": debug}


def _register_commands() -> None:
    cli.add_command(fit.fit_command)
    cli.add_command(resume.resume_command)
    cli.add_command(score.score_command)
    cli.add_command(predict.predict_command)
    cli.add_command(export.export_command)
    cli.add_command(check.check_command)
    cli.add_command(listing.list_command)
    cli.add_command(init.init_command)
    cli.add_command(runs.runs_command)
    cli.add_command(show.show_command)
    cli.add_command(diff.diff_command)
    cli.add_command(plot.plot_command)
    cli.add_command(launch.launch_command)
    cli.add_command(kernels.kernels_command)
    cli.add_command(lr_find.lr_find_command)
    cli.add_command(sweep.sweep_command)


_register_commands()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="mxtrain")
