"""End-to-end: `mxtrain init` writes starter configs that pass `check` and train."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.templates import TEMPLATES, template_text

ROOT = Path(__file__).resolve().parents[2]

# Shrink every template to a few batches of a tiny model; the rest of the file is as shipped.
SHRINK = {
    "lm": [
        "data.train.max_sentences=200",
        "data.eval.max_sentences=40",
        "model.num_embed=8",
        "model.num_hidden=8",
        "model.num_layers=1",
    ],
    # 60 sentences: batches of 16 make at least 3 (the padding rule packs few, full buckets)
    "tagger": [
        "model.num_embed=8",
        "model.num_hidden=8",
        "data.train.min_count=1",
        "data.train.batch_size=16",
    ],
    "classifier": ["model.hidden=[8]", "data.train.batch_size=16"],
    "text_classifier": ["model.num_embed=4", "model.num_hidden=4", "data.train.batch_size=16"],
    "seq2seq": [
        "model.num_embed=8",
        "model.num_hidden=8",
        "data.train.batch_tokens=64",
        "data.eval.batch_tokens=64",
    ],
}


def invoke(*args: str) -> object:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def write_tagger_data(folder: Path) -> None:
    """CoNLL files with a learnable rule: words ending in -ing are VERB, others NOUN."""
    rng = random.Random(0)
    words = ["walking", "talking", "house", "tree", "singing", "car", "dog", "eating"]
    for name, count in (("train.conll", 60), ("dev.conll", 15)):
        lines = []
        for _ in range(count):
            for _ in range(rng.randint(2, 8)):
                word = rng.choice(words)
                lines.append(f"{word} {'VERB' if word.endswith('ing') else 'NOUN'}")
            lines.append("")
        (folder / name).write_text("\n".join(lines) + "\n")


def write_parallel_data(folder: Path) -> None:
    """Source/target line pairs with a learnable rule: the target is the source reversed."""
    rng = random.Random(0)
    words = ["a", "b", "c", "d", "e", "f"]
    for split, count in (("train", 60), ("dev", 15)):
        sources = [[rng.choice(words) for _ in range(rng.randint(1, 6))] for _ in range(count)]
        (folder / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s in sources))
        (folder / f"{split}.tgt").write_text("".join(" ".join(s[::-1]) + "\n" for s in sources))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with data/ for every template: demo arrays/CSV and generated CoNLL files."""
    root = tmp_path_factory.mktemp("init")
    data = root / "data"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_demo_data.py"),
            "--out",
            str(data),
            "--rows",
            "120",
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    write_tagger_data(data)
    write_parallel_data(data)
    return root


def test_init_prints_to_stdout_in_a_real_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mxtrain", "init", "--template", "tagger"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == template_text("tagger")


def test_init_list_names_every_template() -> None:
    result = invoke("init", "--list")
    assert [line.split()[0] for line in result.output.splitlines()] == list(TEMPLATES)


def test_init_never_overwrites_without_force(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("# my edited experiment\n")
    result = invoke("init", "-o", str(target))
    assert result.exit_code == 2
    assert "already exists" in result.output and "--force" in result.output
    assert target.read_text() == "# my edited experiment\n"
    assert invoke("init", "-o", str(target), "--force", "-t", "classifier").exit_code == 0
    assert target.read_text() == template_text("classifier")
    unknown = invoke("init", "--template", "gan")
    assert unknown.exit_code == 2 and "lm" in unknown.output


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_passes_check_and_trains_a_few_batches(name: str, workdir: Path) -> None:
    config = workdir / f"{name}.yaml"
    result = invoke("init", "--template", name, "-o", str(config), "--force")
    assert result.exit_code == 0, result.output
    check = invoke("check", str(config))
    assert check.exit_code == 0, check.output
    overrides = [
        *SHRINK[name],
        f"experiment.runs_dir={workdir / 'runs'}",
        "fit.num_epoch=1",
        "fit.max_batches_per_epoch=3",
        "fit.log_interval=1",
    ]
    args = ["fit", str(config), "--progress", "plain"]
    for override in overrides:
        args += ["--set", override]
    fit = invoke(*args)
    assert fit.exit_code == 0, fit.output
    run = workdir / "runs" / name  # the run is named after the file
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "finished"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    intervals = [r for r in records if r.get("event") == "interval"]
    assert [r["batch"] for r in intervals] == [1, 2, 3]
    epoch = next(r for r in records if r.get("event") == "epoch")
    assert epoch["eval"], "every template evaluates on held-out data"
