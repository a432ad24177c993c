"""initializer.from end to end: the fine-tuning recipe (a trained tagger's embedding and
encoder reused by a new tagger with another label set: frozen embedding, new output layer),
the other sources (a .params file with Gluon-style names, a loader plugin), and the errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SUFFIXES = {"ing": "VERB", "ly": "ADV", "ness": "NOUN", "ful": "ADJ"}
WORDS = [s + x for s in ("bor", "kal", "mip", "tus", "zen") for x in SUFFIXES]
COARSE = {"VERB": "ACTION", "ADV": "OTHER", "NOUN": "OTHER", "ADJ": "OTHER"}
SMALL = [
    "model.num_embed=8",
    "model.num_hidden=12",
    "model.dropout=0.0",
    "data.train.batch_size=16",
    "data.train.min_count=1",
    "data.eval.batch_size=16",
    "optimizer.learning_rate=0.03",
    "fit.num_epoch=3",
]


def write_conll(path: Path, n: int, seed: int, coarse: bool = False) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        for _ in range(rng.randint(3, 9)):
            word = rng.choice(WORDS)
            label = next(y for s, y in SUFFIXES.items() if word.endswith(s))
            lines.append(f"{word} {COARSE[label] if coarse else label}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def fit(folder: Path, name: str, *sets: str) -> tuple[int, str]:
    args = ["fit", str(CONFIGS / "conll_tagger.yaml"), "--name", name, "--progress", "plain"]
    for value in (f"experiment.runs_dir={folder / 'runs'}", *SMALL, *sets):
        args += ["--set", value]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


def params(run: Path, epoch: int) -> dict[str, np.ndarray]:
    loaded = mx.nd.load(str(run / f"model-{epoch:04d}.params"))
    return {k.split(":", 1)[1]: v.asnumpy() for k, v in loaded.items()}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("warm")
    train = write_conll(folder / "train.conll", 150, seed=1)
    dev = write_conll(folder / "dev.conll", 30, seed=2)
    code, output = fit(folder, "tagger", f"data.train.source={train}", f"data.eval.source={dev}")
    assert code == 0, output
    return folder


@pytest.fixture(scope="module")
def coarse(pretrained: Path) -> tuple[Path, str]:
    """The README's recipe: a tagger for another label set from the pretrained one."""
    folder, source = pretrained, pretrained / "runs/tagger"
    train = write_conll(folder / "coarse_train.conll", 150, seed=3, coarse=True)
    dev = write_conll(folder / "coarse_dev.conll", 30, seed=4, coarse=True)
    code, output = fit(
        folder,
        "coarse",
        f"data.train.source={train}",
        f"data.eval.source={dev}",
        f"data.train.vocab={source / 'vocab.json'}",  # the same word ids as the embedding's
        f"initializer.from={{source: '{source}:best', exclude: [pred_*], allow_missing: true}}",
        "fit.fixed_params=[embed_*]",
    )
    assert code == 0, output
    return folder / "runs/coarse", output


def test_fine_tuning_recipe_reuses_the_embedding_and_trains_a_new_head(
    pretrained: Path, coarse: tuple[Path, str]
) -> None:
    source, (run, output) = pretrained / "runs/tagger", coarse
    assert f"weights from {source}" in output and "initialized: pred_bias, pred_weight" in output
    started = json.loads((run / "run.json").read_text())["initialized_from"]
    assert started["source"] == f"{source}:best" and started["checkpoint"].startswith("e000")
    assert started["initialized"] == ["pred_bias", "pred_weight"]
    assert started["ignored"] == ["pred_bias", "pred_weight"]
    assert "embed_weight" in started["loaded"] and any("lstm" in n for n in started["loaded"])
    best_epoch = int(started["checkpoint"][1:5])
    old, new = params(source, best_epoch), params(run, 3)
    np.testing.assert_array_equal(new["embed_weight"], old["embed_weight"])  # loaded, frozen
    assert new["pred_weight"].shape[0] != old["pred_weight"].shape[0]  # the new label set
    accuracy = [
        r["eval"]["accuracy"]
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r["event"] == "epoch"
    ]
    assert accuracy[-1] > 0.9, accuracy


def test_the_fine_tuned_tagger_labels_text_in_onnxruntime(
    coarse: tuple[Path, str], onnxruntime_python: Path, tmp_path: Path
) -> None:
    """The recipe's last step: export to ONNX, then onnxruntime labels as mxtrain does."""
    pytest.importorskip("onnx", reason="the onnx package is a test extra")
    from onnx_helpers import run_onnx

    run, _ = coarse
    out = tmp_path / "onnx"
    args = ["export", f"{run}:best", "-o", str(out), "--format", "onnx", "--bucket", "9"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    sentences = [WORDS[:3], WORDS[4:9]]
    tokens = json.loads((out / "vocab.json").read_text())["tokens"]
    ids = [[tokens.index(w) for w in s] + [0] * (9 - len(s)) for s in sentences]
    probs = {}
    for i, row in enumerate(ids):
        (probs[i],) = run_onnx(
            onnxruntime_python,
            out / "model-bucket9.onnx",
            {"data": np.array([row], "f4")},
            tmp_path,
        )
    source = tmp_path / "in.conll"
    source.write_text("".join("\n".join(s) + "\n\n" for s in sentences))
    predicted = tmp_path / "tags.jsonl"
    result = CliRunner().invoke(
        cli, ["predict", "--checkpoint", f"{run}:best", "--input", str(source), "--output",
              str(predicted)]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    labels = json.loads((out / "label_vocab.json").read_text())["labels"]
    for i, record in enumerate(map(json.loads, predicted.read_text().splitlines())):
        onnx_labels = [labels[k] for k in probs[i][: len(sentences[i])].argmax(axis=1)]
        assert onnx_labels == record["labels"]


def test_a_shape_mismatch_is_named_and_leaves_nothing_behind(pretrained: Path) -> None:
    folder, source = pretrained, pretrained / "runs/tagger"
    train = write_conll(folder / "coarse_train2.conll", 40, seed=5, coarse=True)
    code, output = fit(
        folder,
        "mismatch",
        f"data.train.source={train}",
        f"data.eval.source={train}",
        f"data.train.vocab={source / 'vocab.json'}",
        f"initializer.from={source}",
    )
    assert code == 2, output
    assert "initializer.from: the weights of" in output
    assert "pred_weight is (6, 24) in the source but the model needs (4, 24)" in output
    assert "exclude" in output and "Traceback" not in output
    assert not (folder / "runs/mismatch").exists()


def test_params_file_with_plain_names_and_a_loader_plugin(pretrained: Path) -> None:
    folder, source = pretrained, pretrained / "runs/tagger"
    train, dev = folder / "train.conll", folder / "dev.conll"
    same_data = [f"data.train.source={train}", f"data.eval.source={dev}"]
    trained = params(source, 3)
    # a Gluon-style file (plain names, other prefixes) mapped back by rename
    mx.nd.save(
        str(folder / "gluon.params"),
        {f"tagger0_{k}": mx.nd.array(v) for k, v in trained.items()},
    )
    code, output = fit(
        folder,
        "from_file",
        *same_data,
        f"initializer.from={{source: '{folder / 'gluon.params'}', rename: {{'tagger0_*': '*'}}}}",
        "optimizer.lr_mult={'*': 0}",  # nothing moves: the run ends where its source began
    )
    assert code == 0, output
    for name, value in params(folder / "runs/from_file", 3).items():
        np.testing.assert_array_equal(value, trained[name], err_msg=name)
    (folder / "vectors.py").write_text(
        "import numpy as np\n\n\ndef load():\n"
        f"    return {{'embed_weight': np.full({trained['embed_weight'].shape}, 0.25)}}\n"
    )
    config_sets = [
        "initializer.from={source: 'vectors.py:load', allow_missing: true}",
        "fit.fixed_params=[embed_*]",
    ]
    # the plugin file is relative to the config's folder: give an absolute one here
    config_sets[0] = config_sets[0].replace("vectors.py", str(folder / "vectors.py"))
    code, output = fit(folder, "from_loader", *same_data, *config_sets)
    assert code == 0, output
    assert (params(folder / "runs/from_loader", 3)["embed_weight"] == 0.25).all()


def test_a_missing_source_is_named(pretrained: Path) -> None:
    code, output = fit(
        pretrained,
        "nowhere",
        f"data.train.source={pretrained / 'train.conll'}",
        f"data.eval.source={pretrained / 'dev.conll'}",
        f"initializer.from={pretrained / 'runs/no_such_run'}:best",
    )
    assert code != 0 and "no_such_run does not exist" in output and "Traceback" not in output
    code, output = fit(
        pretrained,
        "nowhere2",
        f"data.train.source={pretrained / 'train.conll'}",
        f"data.eval.source={pretrained / 'dev.conll'}",
        f"initializer.from={pretrained / 'missing.params'}",
    )
    assert code != 0 and "missing.params does not exist" in output
