"""`mxtrain predict --task generate` on a tiny language model trained by `mxtrain fit`."""

from __future__ import annotations

import itertools
import json
import random
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG

from mxtrain.cli.main import cli
from mxtrain.config import load_config
from mxtrain.fit.new_run import fit_experiment

# Every line of the corpus is a stretch of this cycle (3 to 10 words from any start), so the
# model learns the next word of the cycle (and where lines may end): its continuations of a
# prompt can be checked word by word.
CYCLE = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran"]
PROMPTS = ["the a cat", "", "dog", "on mat ran the", "a", "sat", "mat ran"]


def cycle_corpus(path: Path, lines: int, seed: int) -> None:
    rng = random.Random(seed)
    text = []
    for _ in range(lines):
        start, length = rng.randrange(len(CYCLE)), rng.randint(3, 10)
        text.append(" ".join(CYCLE[(start + j) % len(CYCLE)] for j in range(length)))
    path.write_text("\n".join(text) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LM config (fused LSTM) fitted once on the cycle corpus (6 short epochs)."""
    folder = tmp_path_factory.mktemp("generate")
    cycle_corpus(folder / "train.txt", 200, seed=1)
    cycle_corpus(folder / "valid.txt", 30, seed=2)
    config = folder / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=folder / "runs")))
    overrides = ["model.cell=fused", "fit.num_epoch=6", "optimizer.learning_rate=1.0"]
    summary = fit_experiment(load_config(config, overrides))
    return summary.run.path


def follows_the_cycle(prompt: str, output: str) -> bool:
    words = [*prompt.split(), *output.split()]
    return all(CYCLE[(CYCLE.index(a) + 1) % len(CYCLE)] == b for a, b in itertools.pairwise(words))


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("".join(f"{p}\n" for p in PROMPTS), encoding="utf-8")
    return path


def generate(trained: Path, prompts: Path, out: Path, *flags: str) -> list[dict]:
    args = ["predict", "--checkpoint", trained, "--input", prompts, "--output", out]
    result = CliRunner().invoke(cli, [str(a) for a in [*args, "--task", "generate", *flags]])
    assert result.exit_code == 0, result.output
    if out.suffix != ".jsonl":
        return []
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def refused(trained: Path, prompts: Path, tmp_path: Path, *flags: str) -> str:
    args = ["predict", "--checkpoint", trained, "--input", prompts]
    args += ["--output", tmp_path / "refused.jsonl", *flags]
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert not (tmp_path / "refused.jsonl").exists()
    return result.output


def test_greedy_continues_each_prompt_in_input_order(
    trained: Path, prompts: Path, tmp_path: Path
) -> None:
    records = generate(trained, prompts, tmp_path / "greedy.jsonl", "--max-tokens", "6")
    assert [r["line"] for r in records] == list(range(1, len(PROMPTS) + 1))
    assert [r["prompt"] for r in records] == [p or None for p in PROMPTS]
    blank = records[1]
    assert blank["output"] is None and blank["log_likelihood"] is None
    for record in records[:1] + records[2:]:
        words = record["output"].split()
        assert len(words) == record["tokens"] <= 6
        assert record["log_likelihood"] < 0
        assert set(record) == {"line", "prompt", "output", "tokens", "log_likelihood"}
        # the state carried through the prompt: the continuation goes on from its last word
        assert follows_the_cycle(record["prompt"], record["output"]), record
    assert sum(r["tokens"] or 0 for r in records) >= 12  # not just <eos> at once
    # the same prompt twice in a file gives the same text (no state leaks between rows)
    again = generate(trained, prompts, tmp_path / "again.jsonl", "--max-tokens", "6")
    assert again == records


def test_greedy_equals_beam_one(trained: Path, prompts: Path, tmp_path: Path) -> None:
    greedy = generate(trained, prompts, tmp_path / "g.jsonl")
    beam_one = generate(trained, prompts, tmp_path / "b.jsonl", "--beam-size", "1")
    assert greedy == beam_one
    # beam search (beam 3): its best output scores at least as well as greedy's
    beam = generate(trained, prompts, tmp_path / "b3.jsonl", "--beam-size", "3", "--nbest", "2")
    for g, b in zip(greedy, beam, strict=True):
        if g["output"] is None:
            assert b["nbest"] is None
            continue
        best, second = b["nbest"]
        assert best["output"] == b["output"] and best["score"] >= second["score"]
        assert best["log_likelihood"] == b["log_likelihood"]
        assert follows_the_cycle(b["prompt"], b["output"])


def test_sampling_repeats_by_seed(trained: Path, prompts: Path, tmp_path: Path) -> None:
    flags = ("--sample", "--max-tokens", "8")
    first = generate(trained, prompts, tmp_path / "s1.jsonl", *flags, "--seed", "3")
    same = generate(trained, prompts, tmp_path / "s2.jsonl", *flags, "--seed", "3")
    assert first == same
    others = [
        generate(trained, prompts, tmp_path / f"o{s}.jsonl", *flags, "--seed", str(s))
        for s in (4, 5, 6)
    ]
    assert any(o != first for o in others)
    # a batch size of 1 gives each line the same draws; the log-likelihoods may differ by
    # float32 rounding (other kernel shapes): each token's log-probability comes through
    # products and sums of at most 64 terms here (embedding 8, hidden 12, ~20 words)
    alone = generate(
        trained, prompts, tmp_path / "s3.jsonl", *flags, "--seed", "3", "--batch-size", "1"
    )
    eps = float(np.finfo(np.float32).eps)
    for a, f in zip(alone, first, strict=True):
        assert a["output"] == f["output"]
        if f["log_likelihood"] is not None:
            bound = (f["tokens"] + 1) * 64 * eps * (1 + abs(f["log_likelihood"]))
            assert abs(a["log_likelihood"] - f["log_likelihood"]) <= bound
    # top-k 1 samples the most likely token: greedy
    top1 = generate(trained, prompts, tmp_path / "k1.jsonl", "--top-k", "1", "--max-tokens", "8")
    greedy = generate(trained, prompts, tmp_path / "g8.jsonl", "--max-tokens", "8")
    assert [r["output"] for r in top1] == [r["output"] for r in greedy]


def test_csv_and_npy_hold_the_records(trained: Path, prompts: Path, tmp_path: Path) -> None:
    records = generate(trained, prompts, tmp_path / "r.jsonl")
    generate(trained, prompts, tmp_path / "r.csv", "--format", "csv")
    lines = (tmp_path / "r.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "line,rank,prompt,output,tokens,log_likelihood,score"
    assert len(lines) == 1 + len(PROMPTS)
    generate(trained, prompts, tmp_path / "r.npy", "--format", "npy")
    table = np.load(tmp_path / "r.npy", allow_pickle=False)
    assert [str(o) for o in table["output"]] == [r["output"] or "" for r in records]
    assert table["tokens"][1] == -1 and np.isnan(table["log_likelihood"][1])


def test_flags_that_do_not_apply_are_refused(trained: Path, prompts: Path, tmp_path: Path) -> None:
    def says(*flags: str) -> str:
        return refused(trained, prompts, tmp_path, *flags)

    assert "--temperature" in says("--temperature", "0.7")  # without --task generate
    assert "--beam-size" in says("--beam-size", "3")  # a scoring LM predict
    generate_flags = ("--task", "generate")
    assert "--nbest" in says(*generate_flags, "--sample", "--nbest", "2")
    assert "--beam-size" in says(*generate_flags, "--temperature", "0.5", "--beam-size", "2")
    assert "--max-output-ratio" in says(*generate_flags, "--max-output-ratio", "1.5")
    assert "--seed" in says(*generate_flags, "--seed", "3")  # greedy draws nothing
    assert "--nbest 4" in says(*generate_flags, "--beam-size", "2", "--nbest", "4")
    assert "--task" in says(*generate_flags, "--outputs", "raw")
    assert "top-p" in says(*generate_flags, "--top-p", "1.5").lower()
