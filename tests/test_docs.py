"""The user docs match the code: README.md and docs/*.md (the decision records under docs/decisions/ excepted).

Checked here, fast and without training: every profile and CLI command is named in docs/usage.md, every built-in
method in docs/methods.md;
every config key the docs write as `section.key` exists in the config model; no work-tracking references
("issue" or "session" and a number) in the user docs; every relative link points at a file of the repository.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"  # the reference behind the README: profiles, commands, outputs, judges
METHODS = ROOT / "docs" / "methods.md"
ENGINEERING_LOG = "docs/decisions/"  # the decision records may cite issues and sessions (their provenance)
# docs/results.md ends with the tables moved from the decision records; they keep the records' provenance labels
MOVED_TABLES = "\n## Tables moved from the decision records\n"


def user_docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]  # the records sit one folder down


def doc_ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


DOCS = user_docs()


def readme() -> str:
    return README.read_text(encoding="utf-8")


def usage() -> str:
    return USAGE.read_text(encoding="utf-8")


# ---- the README's first screen: two commands and a link --------------------------------------------------------
def test_the_readme_opens_with_the_two_commands_and_a_link() -> None:
    """The first 30 lines hold the two set-up commands (demo and tests) and the link to the reference; the
    runbook follows Quick start."""
    first = "\n".join(readme().splitlines()[:30])
    block = first.split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in block.strip().splitlines()] == [["make", "demo"], ["make", "test"]]
    assert "(docs/usage.md)" in first
    headings = [line for line in readme().splitlines() if line.startswith("## ")]
    assert headings[:2] == ["## Quick start (a fresh machine: Python 3.11, two CPU cores are enough)",
                            "## From a fresh 8-GPU node to the paper's Table 1 (the runbook)"], headings


# ---- profiles, methods, commands: all named in the reference ---------------------------------------------------
def test_every_profile_is_in_the_usage_page() -> None:
    profiles = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert profiles, "no profiles found under configs/"
    text = usage()
    missing = [p for p in profiles if not re.search(rf"(?<![\w-]){re.escape(p)}(?![\w-])", text)]
    assert not missing, f"profiles not named in docs/usage.md: {missing}"


def test_every_builtin_method_is_in_the_methods_page() -> None:
    from arbor.tasks.methods import BUILTIN

    rows = [line for line in METHODS.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    missing = [m for m in BUILTIN if not any(r.startswith(f"| `{m}` |") for r in rows)]
    assert not missing, f"built-in methods without a row in docs/methods.md: {missing}"


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


def test_every_cli_command_is_in_the_usage_page() -> None:
    text = usage()
    missing = [c for c in cli_commands()
               if not re.search(rf"\barbor {re.escape(c)}(?![\w-])", text)]
    assert not missing, f"commands not named in docs/usage.md as `arbor <command>`: {missing}"


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
TRACKING_REF = re.compile(r"\b(?:issue|session)s? #?\d+|\bDESIGN(?:\.md)? §|\bSTACK_NOTES\b", re.I)


def tracked_sources() -> list[Path]:
    """Every file of the repository a reader reads: code, SQL, configs, the Makefile and every document but the
    decision records (which may name the work that led to a decision)."""
    import subprocess

    names = subprocess.run(["git", "ls-files", "*.py", "*.sql", "*.yaml", "*.toml", "*.md", "Makefile", ".ci/*"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if not n.startswith(ENGINEERING_LOG) and (ROOT / n).is_file()]


def test_no_work_tracking_references() -> None:
    """Docstrings, comments and docs cite the paper's sections, docs/ or a decision record, never an issue or a
    session number or a note outside the repository (the design sketch, the stack notes): a reader of the
    repository has none."""
    sources = tracked_sources()
    assert len(sources) > 300 and ROOT / "tasks" / "step.py" in sources and README in sources
    hits = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in sources
            for n, line in enumerate(p.read_text(encoding="utf-8").split(MOVED_TABLES, 1)[0].splitlines(), 1)
            for m in TRACKING_REF.finditer(line)]
    assert not hits, "internal work tracking cited:\n" + "\n".join(hits[:40])


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


# ---- what a user types works: GPU set-up, install and make lines, commands, documented defaults -------------------
INSTALL_TEXTS = [*DOCS, ROOT / "prefect.yaml"]


def _spans(path: Path) -> list[str]:
    """Code spans and fenced blocks of a markdown file; comment lines of a YAML file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".yaml":
        return [line for line in text.splitlines() if line.lstrip().startswith("#")]
    return [m.group(0).strip("`") for m in CODE.finditer(text)]


def test_gpu_torch_spec_is_the_torch_preflight_accepts_for_nccl_sync() -> None:
    """README and docs/gpu.md name the trainer's torch on a GPU node; preflight (weight_sync_problems, reading
    arbor.config.cluster.VLLM_TORCH) must accept it with the default cluster.weight_sync=nccl."""
    from arbor.config import ClusterConfig
    from arbor.config.cluster import VLLM_TORCH
    from arbor.preflight.serving import weight_sync_problems

    nccl = ClusterConfig(weight_sync="nccl")
    specs = {(p.name, m) for p in (README, ROOT / "docs" / "gpu.md")
             for m in re.findall(r"TORCH_SPEC=torch==([0-9][\w.+]*)", p.read_text(encoding="utf-8"))}
    assert {name for name, _ in specs} == {"README.md", "gpu.md"}, specs
    bad = {(name, v): weight_sync_problems(nccl, torch_version=v) for name, v in specs
           if weight_sync_problems(nccl, torch_version=v)}
    assert not bad, bad
    pinned = re.findall(r"vLLM 0\.33\.0 pins `torch==([0-9.]+)`", (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8"))
    assert pinned == [VLLM_TORCH], pinned


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _known_distributions() -> set[str]:
    """Names we can vouch for offline: pinned in constraints files or named by pyproject."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    names: set[str] = set()
    for f in ROOT.glob("constraints*.txt"):
        for line in f.read_text().splitlines():
            if line and not line.startswith("#") and "==" in line:
                names.add(canonicalize_name(line.split("==")[0]))
    project = _pyproject()["project"]
    for req in [*project["dependencies"], *(r for rs in project["optional-dependencies"].values() for r in rs)]:
        names.add(canonicalize_name(Requirement(req).name))
    names.discard(canonicalize_name(project["name"]))  # arbor-rl itself is on no index
    return names


def install_problem(args: list[str]) -> str | None:
    """None if every requirement of a `pip install ARGS` line names something that exists, else why not."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    extras = set(_pyproject()["project"]["optional-dependencies"])
    args = re.sub(r"\$\(ls ([^)]*)\)", r"\1", " ".join(args)).split()  # "$(ls dist/x-*.whl)[e]": the wheel's path
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg in ("-c", "-r", "--index-url", "--extra-index-url", "-i"):
            skip_next = True
            continue
        if arg.startswith("-"):
            continue
        target, extra = (re.match(r"^(.*?)(?:\[([\w,-]+)\])?$", arg.strip("'\"")) or re.match("(.*)()", arg)).groups()
        if extra and not set(extra.split(",")) <= extras:
            return f"{arg}: no such extra in pyproject.toml"
        if target.startswith(("$(ls dist/", "dist/")):  # make dist's wheel
            if "dist" not in makefile_targets():
                return f"{arg}: no `make dist` target"
            continue
        if target in (".", "./") or "/" in target:
            if not (ROOT / target).exists():
                return f"{arg}: no such path in the repository"
            continue
        try:
            name = canonicalize_name(Requirement(target).name)
        except InvalidRequirement:
            return f"{arg}: not a requirement"
        if name not in _known_distributions():
            return f"{arg}: {name} is not a distribution arbor pins or depends on (is it on a package index?)"
    return None


def test_install_checker_accepts_and_refuses() -> None:
    assert install_problem(["-c", "constraints.txt", "'.[tracking]'"]) is None
    assert install_problem(['"$(ls', 'dist/arbor_rl-*.whl)[tracking]"']) is None
    assert install_problem(["'wandb>=0.31,<0.32'"]) is None
    assert install_problem(["arbor-rl"]) is not None
    assert install_problem(["'arbor-rl[tracking]'"]) is not None
    assert install_problem(["'.[nonsense]'"]) is not None


@pytest.mark.parametrize("doc", INSTALL_TEXTS, ids=doc_ids(INSTALL_TEXTS))
def test_every_pip_install_and_make_line_names_something_that_exists(doc: Path) -> None:
    bad = []
    targets = makefile_targets()
    for span in _spans(doc):
        for cmd in re.findall(r"\bpip install ([^`\n;|&)]*(?:\)[^`\n;|&]*)?)", span):
            words = cmd.split("#", 1)[0].split()
            if problem := install_problem(words):
                bad.append(problem)
        for m in re.finditer(r"(?<![\w-])make((?: [A-Z_]+=\S+)*) ([a-z][\w-]*)", span):
            if m.group(2) not in targets:
                bad.append(f"make {m.group(2)}: no such Makefile target")
        for var in re.findall(r"\bmake(?: [a-z][\w-]*)* ([A-Z_]+)=", span):
            if not re.search(rf"^{var}\s*\?=", (ROOT / "Makefile").read_text(), re.M):
                bad.append(f"make {var}=: the Makefile has no such variable")
    assert not bad, f"{doc.relative_to(ROOT)}: {bad}"


def test_the_missing_logger_error_names_a_command_that_installs_something() -> None:
    from arbor.tasks.reporting.tracking import install_hint

    for logger in ("wandb", "mlflow"):
        hint = install_hint(logger)
        cmds = re.findall(r"pip install ((?:-c \S+ )?'[^']+')", hint)
        assert cmds, hint
        for cmd in cmds:
            assert install_problem(cmd.split()) is None, (logger, cmd)


def test_makefile_installs_cpu_torch_from_the_cpu_index_with_a_fallback() -> None:
    """`make -n` (nothing runs): torch from PyTorch's CPU wheel index, and the configured index when that one does
    not answer (CI reaches only the package registries); TORCH_INDEX= (empty) asks only the configured index."""
    import subprocess

    def torch_line(*args: str) -> str:
        out = subprocess.run(["make", "-n", "-B", ".venv/bin/.installed", "VENV=.venv", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        [line] = [ln for ln in out.splitlines() if "pip install" in ln and "torch==" in ln and "-c" not in ln.split()]
        return line

    default = torch_line()
    first, _, fallback = default.partition("||")
    assert '--index-url "https://download.pytorch.org/whl/cpu" "torch==2.13.0"' in first, default
    assert re.search(r'pip install -q "torch==2\.13\.0"', fallback), default
    gpu = torch_line("TORCH_SPEC=torch==2.14.0", "TORCH_INDEX=https://download.pytorch.org/whl/cu128")
    assert '--index-url "https://download.pytorch.org/whl/cu128" "torch==2.14.0"' in gpu, gpu
    plain = torch_line("TORCH_INDEX=")
    assert "--index-url" not in plain and plain.endswith('pip install -q "torch==2.13.0"'), plain


def _make_n(*args: str) -> str:
    """What `make -n ARGS` would run (nothing runs)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # run under `make test`
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True, env=env).stdout


def test_make_setup_reinstalls_torch_when_its_spec_changes_and_only_then(tmp_path: Path) -> None:
    """A venv set up with the CPU torch (`make demo`): `make setup` with the GPU node's TORCH_SPEC / TORCH_INDEX
    reinstalls torch (and what is built against it), in the same venv; the same pair again does nothing."""
    import os

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".torch-spec").write_text("torch==2.13.0 https://download.pytorch.org/whl/cpu\n")
    installed = venv / "bin" / ".installed"
    installed.touch()
    later = max(p.stat().st_mtime for p in (ROOT / "pyproject.toml", ROOT / "constraints.txt",
                                             venv / ".torch-spec")) + 60
    os.utime(installed, (later, later))
    assert "pip" not in _make_n("setup", f"VENV={venv}")  # the pair it was set up with: nothing to do
    gpu = _make_n("setup", f"VENV={venv}", "TORCH_SPEC=torch==2.14.0",
                  "TORCH_INDEX=https://download.pytorch.org/whl/cu128")
    assert f"{venv}/bin/pip uninstall -q -y torch" in gpu, gpu
    assert '--index-url "https://download.pytorch.org/whl/cu128" "torch==2.14.0"' in gpu, gpu
    assert f"'torch==2.14.0 https://download.pytorch.org/whl/cu128' > {venv}/.torch-spec" in gpu, gpu
    assert "-m venv" not in gpu and '-e ".[dev]"' in gpu  # the same venv; what depends on torch reinstalled over it
    assert "pip" not in _make_n("setup", f"VENV={venv}")  # a dry run changed nothing


def test_make_clean_never_deletes_the_runs() -> None:
    clean = _make_n("clean")
    assert "rm -rf .venv" in clean and ".arbor" not in clean, clean
    assert _make_n("clean-runs").strip() == "rm -rf .arbor"


def test_no_extra_puts_vllm_beside_arbor() -> None:
    """vLLM 0.33 caps fastapi below 0.137 and prefect 3.8.8 needs 0.139 or newer: an extra holding vLLM could never
    resolve, so vLLM has an environment of its own (make vllm-env) and no doc offers such an extra."""
    extras = _pyproject()["project"]["optional-dependencies"]
    assert not [r for reqs in extras.values() for r in reqs if re.match(r"vllm\b", r)], extras
    docs = [README, *(ROOT / "docs").glob("*.md")]
    offers = [p.name for p in docs
              if re.search(r"\[gpu\]|`gpu` extra pins", p.read_text(encoding="utf-8"))]
    assert not offers, offers


def readme_commands() -> list[str]:
    """The `arbor ...` lines of docs/usage.md's command block, comments removed."""
    block = usage().split("## Commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.startswith("arbor ")]


@pytest.mark.parametrize("line", readme_commands())
def test_each_readme_command_and_its_options_exist(line: str) -> None:
    """Each command of the usage page answers --help, and every option the line uses is one that command takes."""
    import shlex

    from typer.testing import CliRunner

    from arbor.cli import app

    words = shlex.split(line)[1:]
    commands = set(cli_commands())
    path = next(p for p in (words[:2], words[:1]) if " ".join(p) in commands)
    res = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    options = [w.split("=", 1)[0] for w in words if w.startswith("-")]
    missing = [o for o in options if o not in res.output]
    assert not missing, f"`{line}`: options not in `arbor {' '.join(path)} --help`: {missing}"


def test_readme_commands_that_are_cheap_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-only commands of the usage page run as written on a fresh workspace."""
    import shlex

    from typer.testing import CliRunner

    from arbor.cli import app

    monkeypatch.setenv("ARBOR_HOME", str(tmp_path / "home"))
    cheap = [c for c in readme_commands() if c.startswith(("arbor config show", "arbor runs"))]
    assert len(cheap) == 2, cheap
    for line in cheap:
        res = CliRunner().invoke(app, shlex.split(line)[1:])
        assert res.exit_code == 0, (line, res.output)


def test_documented_defaults_are_the_code_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each default docs/usage.md and docs/gpu.md state, read back from the code that sets it."""
    from arbor.config import ArborConfig
    from arbor.flows.progress import PROGRESS_EVERY_S
    from arbor.paths import arbor_home

    text = usage() + (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    cfg = ArborConfig()

    def said(pattern: str) -> str:
        m = re.search(pattern, text, re.S)
        assert m, pattern
        return m.group(1)

    assert said(r"`judge\.model` is `([^`]+)`") == cfg.judge.model
    assert said(r"`judge\.api_key_env` \(default `([^`]+)`\)") == cfg.judge.api_key_env
    assert said(r"`judge\.backend=(\w+)` \(offline heuristics\) in the CPU profiles") == cfg.judge.backend
    assert said(r"# run the arbor-train flow \(default profile: ([\w-]+)\)") == "tiny-cpu" == cfg.run.profile
    monkeypatch.delenv("ARBOR_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert said(r"under `ARBOR_HOME` \(default `([^`]+)`\)") == "./.arbor"
    assert arbor_home() == (tmp_path / ".arbor").resolve()
    assert float(said(r"every `ARBOR_PROGRESS_SECONDS`\s+\(default (\d+)\)")) == PROGRESS_EVERY_S
    assert said(r"`TORCH_INDEX`\s+\(default `([^`]+)`") == re.search(
        r"^TORCH_SPEC \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert said(r"`TORCH_INDEX`\s+\(default `[^`]+` from (PyTorch's CPU wheel index)") and "whl/cpu" in re.search(
        r"^TORCH_INDEX \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)


# ---- what a paper profile runs, as the docs tell it ----------------------------------------------------------------
def test_the_dapo_row_names_what_each_profile_runs() -> None:
    """`dapo` runs the variant of `train.dapo_variant`: docs/methods.md's row says what each variant a profile uses does
    (the qwen3 ARBOR profiles run ARBOR §4.1's baseline, without clip-higher or refill)."""
    from arbor.config import load_config

    row = next(line for line in METHODS.read_text().splitlines() if line.startswith("| `dapo` |"))
    used = {load_config(p.stem).train.dapo_variant for p in (ROOT / "configs").glob("*.yaml")}
    assert used == {"dapo-paper", "arbor-paper"}
    for variant in used:
        assert f"`{variant}`" in row or f"dapo_variant={variant}" in row, (variant, row)
    assert "nothing refilled" in row


def test_rubricem_runs_through_its_own_profiles_deployments() -> None:
    """docs/sft.md's RubricEM lines run RubricEM's profile (its SFT start, queries and judge), not ARBOR's
    `qwen3-8b` deployments with overrides."""
    lines = [line for line in (ROOT / "docs" / "sft.md").read_text().splitlines() if "deployment run" in line]
    runs = [re.search(r"deployment run '([^']+)'", line).group(1) for line in lines]  # type: ignore[union-attr]
    assert "arbor-train/qwen3-8b-rubricem" in runs and "arbor-sft/qwen3-8b-rubricem" in runs
    assert not any(r.endswith("/qwen3-8b") for r in runs), runs


# ---- the stage diagrams are the methods' stage lists -------------------------------------------------------------
def _diagram_stages(line: str) -> list[str]:
    """``a ─► b (note) ─► c`` -> [a, b, c]."""
    return [re.sub(r"\s*\(.*?\)", "", part).strip() for part in line.split("─►")]


def test_stage_diagrams_are_the_methods_stage_lists() -> None:
    """docs/methods.md's diagram (one line per method or methods) and the ARBOR diagrams of docs/interfaces.md and
    docs/architecture.md give each method's stages in the order ``Method.stages`` runs them."""
    from arbor.tasks.methods import BUILTIN, resolve_method

    stages = {m: [s.name for s in resolve_method(m).stages] for m in BUILTIN}
    block = METHODS.read_text(encoding="utf-8").split("```", 2)[1]
    drawn: dict[str, list[str]] = {}
    for line in block.strip().splitlines():
        names, diagram = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        for m in names.split(", "):
            drawn[m] = _diagram_stages(diagram)
    assert drawn == stages
    for page in ("interfaces.md", "architecture.md"):
        [line] = [ln for ln in (ROOT / "docs" / page).read_text(encoding="utf-8").splitlines()
                  if ln.startswith("rollout ─►")]
        assert _diagram_stages(line)[:len(stages["arbor"])] == stages["arbor"], page
