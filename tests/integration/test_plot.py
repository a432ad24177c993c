"""End-to-end: `mxtrain plot` draws real runs' curves to a PNG of the asked size."""

from __future__ import annotations

import builtins
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_CONFIG, write_corpus

from mxtrain.cli.main import cli

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is part of the test extra")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny runs that differ in learning rate and length: runs/slow and runs/fast."""
    root = tmp_path_factory.mktemp("plot")
    write_corpus(root / "train.txt", 120, seed=1)
    write_corpus(root / "valid.txt", 30, seed=2)
    config = root / "tiny.yaml"
    config.write_text(textwrap.dedent(TINY_CONFIG.format(runs_dir=root / "runs")))
    for name, lr, epochs in (("slow", "0.05", "2"), ("fast", "0.8", "3")):
        result = CliRunner().invoke(
            cli,
            [
                "fit",
                str(config),
                "--name",
                name,
                "--set",
                f"optimizer.learning_rate={lr}",
                "--set",
                f"fit.num_epoch={epochs}",
            ],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
    return root / "runs"


def plot(*args: str) -> Any:
    return CliRunner().invoke(cli, ["plot", *args], catch_exceptions=False)


def pixels(path: Path) -> np.ndarray:
    import matplotlib.image

    return np.asarray(matplotlib.image.imread(str(path)))


def coloured(image: np.ndarray) -> int:
    """Pixels that are neither white, grey nor black: the curves (axes and text are grey)."""
    rgb = image[..., :3]
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.2).sum())


def test_plot_writes_a_png_of_the_requested_size(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "curves.png"
    result = plot(
        str(runs / "slow"), str(runs / "fast"), "-o", str(out), "--width", "640", "--height", "360"
    )
    assert result.exit_code == 0, result.output
    assert "perplexity, 2 run(s), 640x360 px" in result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = pixels(out)
    assert image.shape[:2] == (360, 640)
    assert coloured(image) > 200, "the curves are drawn in colour"


def test_different_runs_give_different_pictures(runs: Path, tmp_path: Path) -> None:
    images = {}
    for name in ("slow", "fast"):
        out = tmp_path / f"{name}.png"
        assert plot(str(runs / name), "--metric", "perplexity", "-o", str(out)).exit_code == 0
        images[name] = pixels(out)
    again = tmp_path / "slow_again.png"
    assert plot(str(runs / "slow"), "-o", str(again)).exit_code == 0
    assert np.array_equal(pixels(again), images["slow"]), "the same run draws the same picture"
    differing = np.abs(images["slow"] - images["fast"]).max(axis=-1) > 0.1
    assert differing.sum() > 500, "two runs with other curves must not look alike"
    # overlaying both adds the second run's colour to the first run's picture
    both = tmp_path / "both.png"
    assert plot(str(runs / "slow"), str(runs / "fast"), "-o", str(both)).exit_code == 0
    assert coloured(pixels(both)) > coloured(images["slow"])


def test_plot_keeps_an_existing_file_and_checks_the_metric(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "keep.png"
    out.write_bytes(b"mine")
    result = plot(str(runs / "slow"), "-o", str(out))
    assert result.exit_code == 2 and "already exists" in result.output
    assert out.read_bytes() == b"mine"
    assert plot(str(runs / "slow"), "-o", str(out), "--force").exit_code == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    result = plot(str(runs / "slow"), "--metric", "accuracy", "-o", str(tmp_path / "a.png"))
    assert result.exit_code == 2
    assert "'accuracy'" in result.output and "perplexity" in result.output
    assert not (tmp_path / "a.png").exists()


def test_missing_matplotlib_is_one_clear_paragraph(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "x.png"
    result = plot(str(runs / "slow"), "-o", str(out))
    assert result.exit_code == 2
    assert "needs matplotlib" in result.output and "pip install 'mxtrain[plot]'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()
