"""The starter configs of `mxtrain init`: shipped, commented, valid, never written over."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxtrain.config import config_to_dict, load_config
from mxtrain.errors import ConfigError
from mxtrain.templates import TEMPLATES, template_text, write_template


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_every_template_loads_and_explains_itself(name: str, tmp_path: Path) -> None:
    text = template_text(name)
    path = tmp_path / f"my_{name}.yaml"
    path.write_text(text)
    config = load_config(path)
    # experiment.name is left to the file name, so `init -o NAME.yaml` names the run
    assert config.experiment.name == f"my_{name}"
    lines = [line for line in text.splitlines() if line.strip()]
    commented = [line for line in lines if "#" in line]
    assert len(commented) >= len(lines) // 2, "a starter config explains most of its lines"
    assert config_to_dict(config)["model"]["name"] in text


def test_unknown_template_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="lm, tagger"):
        template_text("gan")


def test_write_template_never_overwrites_without_force(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("my edits\n")
    with pytest.raises(ConfigError, match="already exists"):
        write_template("tagger", target)
    assert target.read_text() == "my edits\n"
    write_template("tagger", target, force=True)
    assert target.read_text() == template_text("tagger")
    with pytest.raises(ConfigError, match="does not exist"):
        write_template("lm", tmp_path / "no" / "such" / "x.yaml")
    with pytest.raises(ConfigError, match="is a folder"):
        write_template("lm", tmp_path)
