"""The user docs match the code: README.md and docs/*.md (docs/decisions.md, the engineering log, excepted).

Checked here, fast and without training: every profile, built-in method and CLI command is named in the README;
every config key the docs write as `section.key` exists in the config model; no work-tracking references
("issue 12", "session 6") in the user docs; every relative link points at a file of the repository.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ENGINEERING_LOG = "decisions.md"  # docs/decisions.md may cite issues and sessions: it is the engineering log


def user_docs() -> list[Path]:
    return [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != ENGINEERING_LOG)]


def doc_ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


DOCS = user_docs()


def readme() -> str:
    return README.read_text(encoding="utf-8")


# ---- profiles, methods, commands: all named in the README ------------------------------------------------------
def test_every_profile_is_in_the_readme() -> None:
    profiles = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert profiles, "no profiles found under configs/"
    text = readme()
    missing = [p for p in profiles if not re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", text)]
    assert not missing, f"profiles not named in README.md: {missing}"


def test_every_builtin_method_is_in_the_readme() -> None:
    from arbor.tasks.methods import BUILTIN

    text = readme()
    missing = [m for m in BUILTIN if not re.search(rf"`{re.escape(m)}`", text)]
    assert not missing, f"built-in methods not named (as `name`) in README.md: {missing}"


def cli_commands() -> list[str]:
    """Every command of the typer app, sub-commands as 'group name'."""
    import typer

    from arbor.cli import app

    def walk(cmd: object, prefix: tuple[str, ...]) -> list[str]:
        subs = getattr(cmd, "commands", None)  # a group (typer's own click or click's; both have .commands)
        if subs:
            return [n for name, sub in sorted(subs.items()) for n in walk(sub, (*prefix, name))]
        return [" ".join(prefix)]

    return walk(typer.main.get_command(app), ())


def test_cli_walk_finds_groups_and_commands() -> None:
    cmds = cli_commands()
    assert {"train", "sql", "config show", "rubrics export"} <= set(cmds), cmds


def test_every_cli_command_is_in_the_readme() -> None:
    text = readme()
    missing = [c for c in cli_commands()
               if not re.search(rf"\barbor {re.escape(c)}(?![\w-])", text)]
    assert not missing, f"commands not named in README.md as `arbor <command>`: {missing}"


# ---- config keys in the docs exist --------------------------------------------------------------------------------
SECTIONS = ("run", "rollout", "judge", "memory", "train", "sft", "data", "search", "cluster", "checkpoint", "tracking",
            "eval", "guidance", "policy", "reward", "rubricem", "arco", "world", "deviations")
# a key starts a dotted name (not `arbor.tasks.env.search.make_search`, not `tasks/training/train.py`) and is not
# a call in a code sample (`run.store.load(...)`, `judge.drain_calls()`)
KEY = re.compile(rf"(?<![\w./:$-])(?:{'|'.join(SECTIONS)})\.[a-z_]+(?:\.[a-z_]+)*(?![\w.(])")
# `run.py`, `train.jsonl`: a file of that name, not a key
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "sql", "txt", "parquet", "png", "csv", "toml", "gguf"}
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
FOREIGN = re.compile(r"\bverl(?:'s)? $")  # "verl `data.train_files`": verl's key, named to map it onto arbor's


def config_key_problem(key: str) -> str | None:
    """None if ``key`` (``section.field[.sub...]``) names a field of ArborConfig, else why not."""
    from pydantic import BaseModel

    from arbor.config import ArborConfig

    model: type[BaseModel] = ArborConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return f"no field {part!r} in {'.'.join(parts[:i]) or 'the config'} ({model.__name__})"
        ann = field.annotation
        if typing.get_origin(ann) is dict or ann is dict:  # deviations, train.deepspeed: free keys below
            return None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
            continue
        if i < len(parts) - 1:
            return f"{'.'.join(parts[:i + 1])} is a value, not a section"
    return None


def doc_config_keys(text: str) -> set[str]:
    keys: set[str] = set()
    for code in CODE.finditer(text):
        if FOREIGN.search(text[max(0, code.start() - 7):code.start()]):
            continue
        for key in KEY.findall(code.group(0)):
            if key.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                continue
            keys.add(key)
    return keys


def test_config_key_checker_accepts_and_refuses() -> None:
    assert doc_config_keys("`--set judge.roles.pairwise.model=m` `arbor.tasks.env.search.make_search` `run.py` "
                           "`judge.drain_calls()` verl `data.train_files`") == {"judge.roles.pairwise.model"}
    assert config_key_problem("judge.roles.pairwise.model") is None
    assert config_key_problem("train.deepspeed.zero_optimization") is None
    assert config_key_problem("memory.lambda_") is None
    assert config_key_problem("judge.nonsense") is not None
    assert config_key_problem("run.steps.more") is not None


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids(DOCS))
def test_config_keys_in_docs_exist(doc: Path) -> None:
    bad = {k: why for k in sorted(doc_config_keys(doc.read_text(encoding="utf-8")))
           if (why := config_key_problem(k)) is not None}
    assert not bad, f"{doc.relative_to(ROOT)} names config keys the config model does not have: {bad}"


# ---- no work-tracking references, no links outside the repository ------------------------------------------------
TRACKING_REF = re.compile(r"\b(?:issue|session)s? #?\d+", re.I)


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids(DOCS))
def test_no_work_tracking_references(doc: Path) -> None:
    hits = [(n, m.group(0)) for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
            for m in TRACKING_REF.finditer(line)]
    assert not hits, f"{doc.relative_to(ROOT)} cites internal work tracking (line, text): {hits}"


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)>\s]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#)", re.I)  # http:, https:, mailto:, an anchor
PARENT_PATH = re.compile(r"(?<![\w/.])(?:\.\./)+[\w./-]+")  # `../shared/papers/x.txt`


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids(DOCS))
def test_relative_links_point_inside_the_repository(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(text):
        if EXTERNAL.match(target):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    for span in CODE.findall(text):  # a path written in code that climbs out of the docs' folder
        for target in PARENT_PATH.findall(span):
            path = (doc.parent / target).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                bad.append(target)
    assert not bad, f"{doc.relative_to(ROOT)} links to files that are not in the repository: {bad}"


@pytest.mark.parametrize("profile", sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")))
def test_config_show_cites_no_work_tracking(profile: str) -> None:
    """What `arbor config show` prints (every value, its source, the profile's deviations and the field help) is
    user text too."""
    from typer.testing import CliRunner

    from arbor.cli import app

    res = CliRunner().invoke(app, ["config", "show", "--profile", profile])
    assert res.exit_code == 0, res.output
    hits = [m.group(0) for m in TRACKING_REF.finditer(res.output)]
    assert not hits, (profile, hits)
