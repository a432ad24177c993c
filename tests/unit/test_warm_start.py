"""initializer.from: matching a source's parameters to the model's (renames, exclusions,
missing and extra parameters, shapes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mxtrain.config.schema import WarmStartSection
from mxtrain.errors import ConfigError, InvalidValue
from mxtrain.fit.warm_start import _is_loader, match_parameters

MODEL = {
    "embed_weight": (10, 4),
    "enc_l0_weight": (8, 4),
    "enc_l0_bias": (8,),
    "pred_weight": (3, 8),
}


def source(**shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {name: np.full(shape, i, dtype="f4") for i, (name, shape) in enumerate(shapes.items())}


def spec(**options: object) -> WarmStartSection:
    return WarmStartSection(source="runs/x:best", **options)  # type: ignore[arg-type]


def test_same_names_and_shapes_load_everything() -> None:
    arrays = source(**MODEL)
    chosen, report = match_parameters(arrays, MODEL, spec(), "cfg.yaml:3")
    assert sorted(chosen) == sorted(MODEL) and report.initialized == report.ignored == []
    assert all(chosen[n] is arrays[n] for n in MODEL)


def test_rename_carries_each_star_over_in_order() -> None:
    arrays = source(
        tagger_embed_weight=(10, 4), tagger_l0_weight=(8, 4), tagger_l0_bias=(8,), out=(3, 8)
    )
    rename = {"tagger_embed_*": "embed_*", "tagger_l*_*": "enc_l*_*", "out": "pred_weight"}
    chosen, report = match_parameters(arrays, MODEL, spec(rename=rename), "w")
    assert sorted(chosen) == sorted(MODEL)
    assert report.renamed == {
        "tagger_embed_weight": "embed_weight",
        "tagger_l0_weight": "enc_l0_weight",
        "tagger_l0_bias": "enc_l0_bias",
        "out": "pred_weight",
    }
    assert chosen["enc_l0_bias"] is arrays["tagger_l0_bias"]


def test_new_output_layer_recipe_exclude_and_allow_missing() -> None:
    arrays = source(**{**MODEL, "pred_weight": (7, 8)})  # the old task had 7 classes
    with pytest.raises(ConfigError, match=r"pred_weight is \(7, 8\) in the source but the model"):
        match_parameters(arrays, MODEL, spec(), "w")
    chosen, report = match_parameters(
        arrays, MODEL, spec(exclude=("pred_*",), allow_missing=True), "w"
    )
    assert "pred_weight" not in chosen and report.initialized == ["pred_weight"]
    assert report.ignored == ["pred_weight"]


@pytest.mark.parametrize(
    ("shapes", "options", "words"),
    [
        ({"embed_weight": (10, 4)}, {}, "enc_l0_bias, enc_l0_weight, pred_weight are not in"),
        ({**MODEL, "extra_weight": (2,)}, {}, "the source has parameters the model lacks: extra"),
        ({"other": (1,)}, {"allow_missing": True, "allow_extra": True}, "no parameter of the"),
        (MODEL, {"rename": {"zzz*": "a*"}}, "rename pattern 'zzz*' matches no parameter"),
        (MODEL, {"exclude": ("zzz",)}, "exclude pattern 'zzz' matches no parameter"),
        (MODEL, {"rename": {"enc_*": "x*", "*_bias": "y*"}}, "matches the rename patterns"),
        (
            {**MODEL, "embed2_weight": (10, 4)},
            {"rename": {"embed2_*": "embed_*"}},
            "would both set 'embed_weight'",
        ),
    ],
)
def test_problems_are_named(shapes: dict, options: dict, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        match_parameters(source(**shapes), MODEL, spec(**options), "cfg.yaml:7")
    message = str(err.value)
    assert message.startswith("cfg.yaml:7: initializer.from: ") and words in message
    assert "embed_weight (10, 4)" in message  # the model's own names and shapes are listed


def test_missing_and_extra_pass_when_allowed() -> None:
    arrays = source(embed_weight=(10, 4), old_weight=(5,))
    chosen, report = match_parameters(
        arrays, MODEL, spec(allow_missing=True, allow_extra=True), "w"
    )
    assert list(chosen) == ["embed_weight"]
    assert report.initialized == ["enc_l0_bias", "enc_l0_weight", "pred_weight"]
    assert report.ignored == ["old_weight"]


def test_section_checks() -> None:
    with pytest.raises(InvalidValue, match="at most 1"):
        WarmStartSection(source="x", rename={"a*": "b**"})
    with pytest.raises(InvalidValue, match="no other wildcard"):
        WarmStartSection(source="x", rename={"a*": "b?"})
    with pytest.raises(InvalidValue, match="source"):
        WarmStartSection(source="  ")


def test_loader_references_are_told_from_run_folders(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tagger").mkdir()
    assert _is_loader("weights.py:load") and _is_loader("my_pkg.weights:load")
    assert not _is_loader("tagger:best")  # a run folder named tagger exists here
    assert not _is_loader("runs/tagger:best") and not _is_loader("runs/tagger:3")
    assert not _is_loader("model-0003.params")
