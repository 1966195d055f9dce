"""Behaviour check for refactors: every shipped method stores the same rows before and after a change.

    python bench/same_rows.py --ref fa7e91e                       # this tree vs commit fa7e91e
    python bench/same_rows.py --ref main --profile tiny-world --set run.start_checkpoint=PATH   # a policy that
                                                                  # answers some questions, so rubrics get induced
    python bench/same_rows.py --ref main --methods arco co-react --judge scripted   # the judge over HTTP

Each method (the built-ins, and ``co-react``: GRPO on Co-ReAct's guided rollouts) trains a short run (same seed and
overrides, plus what the method needs of the profile: ``METHOD_SETS``) once in a checkout of ``--ref`` and once in
this tree, each in a fresh workspace and its own process; then every table either run stored (the pipeline's and the
method's own) is compared row by row with the columns that measure time left out. ``--judge scripted`` points
``judge.backend=openai`` at the scripted OpenAI-compatible server (``tests/openai_server.py``), one server process
per side, each side its own tree's. Prints one line per (method, table) and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.learning import RUBRICEM_SETS  # noqa: E402  (SS-GRPO's and RubricEM's stage scaffold)

METHODS = ("arbor", "grpo", "dapo", "rar", "no-memory", "ss-grpo", "rubricem", "arco", "co-react")
# what a method needs beyond the profile; co-react is no training method but guided rollouts, here under GRPO
METHOD_SETS: dict[str, dict[str, Any]] = {"ss-grpo": RUBRICEM_SETS, "rubricem": RUBRICEM_SETS,
                                          "co-react": {"run.method": "grpo", "guidance.mode": "co-react"}}
JUDGE_KEY_ENV = "ARBOR_SAME_ROWS_JUDGE_KEY"  # the scripted server takes any key; the client wants one
TABLES = ("trajectories", "rubric_events", "rubric_activations", "rubric_sources", "draft_scores", "judge_calls",
          "steps")
TIMING = {"wall_seconds", "completed_at", "created_at", "gen_seconds", "latency_s", "started_at", "finished_at"}
DEFAULTS = {"run.steps": 2, "run.sft_warm_start": False, "run.eval_every": None, "rollout.batch_size": 4, "rollout.k": 4,
            "memory.k_consol": 1, "checkpoint.every": 1}

TRAIN = """
import importlib.util, json, sys
from pathlib import Path

tree = Path.cwd()
if (tree / "tasks").is_dir() and '"arbor.tasks" = "tasks"' in (tree / "pyproject.toml").read_text():
    # the arbor.* layout: map this tree's folders into arbor.*, as package-dir does on install
    import arbor
    mods = []
    for name in ("storage", "llm", "tasks", "flows"):
        spec = importlib.util.spec_from_file_location(f"arbor.{name}", tree / name / "__init__.py",
                                                      submodule_search_locations=[str(tree / name)])
        mods.append((spec, importlib.util.module_from_spec(spec)))
        sys.modules[spec.name] = mods[-1][1]
        setattr(arbor, name, mods[-1][1])
    for spec, mod in mods:
        spec.loader.exec_module(mod)
    from arbor.flows.train import arbor_train
else:  # the layout before it: top-level flows, tasks, storage, llm
    from flows.train import arbor_train
arbor_train(profile=sys.argv[3], overrides=json.loads(sys.argv[1]), run_id=sys.argv[2])
"""


def train(tree: Path, home: Path, method: str, sets: dict[str, Any], profile: str) -> None:
    """Train ``method`` (its run id) in ``tree`` with the workspace ``home``."""
    env = {**os.environ, "ARBOR_HOME": str(home), "PYTHONPATH": str(tree), JUDGE_KEY_ENV: "sk-same-rows"}
    overrides = {**sets, "run.method": method, **METHOD_SETS.get(method, {})}
    proc = subprocess.run([sys.executable, "-c", TRAIN, json.dumps(overrides), method, profile],
                          cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {method} failed\n{proc.stderr[-3000:]}")


@contextmanager
def judge_server(tree: Path, kind: str) -> Iterator[dict[str, Any]]:
    """The judge overrides of one side: none for the rules judge; for ``scripted``, ``tree``'s scripted server in
    its own process, for as long as the side's runs last."""
    if kind == "rules":
        yield {}
        return
    proc = subprocess.Popen([sys.executable, str(tree / "tests" / "openai_server.py")], stdout=subprocess.PIPE,
                            text=True, cwd=tree)
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if not line.startswith("PORT "):
            raise SystemExit(f"{tree}: the scripted judge server did not start ({line!r})")
        yield {"judge.backend": "openai", "judge.base_url": f"http://127.0.0.1:{int(line.split()[1])}/v1",
               "judge.api_key_env": JUDGE_KEY_ENV, "judge.model": "scripted-judge"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def rows(table: str, run_id: str, home: Path, leave_out: frozenset[str] = frozenset()) -> list[tuple]:
    from arbor.storage.parquet import read_table

    out = []
    for r in read_table(table, run_id=run_id, home=home).to_pylist():
        out.append(tuple(sorted((k, repr(v)) for k, v in r.items() if k not in TIMING and k not in leave_out)))
    return sorted(out)


def differing_columns(a: list[tuple], b: list[tuple]) -> list[str]:
    """The columns whose values differ between two sorted row lists (row by row), or that one side lacks, each
    with its first differing pair of values (reference -> this tree)."""
    cols: dict[str, str] = {}
    for ra, rb in zip(a, b, strict=False):
        da, db = dict(ra), dict(rb)
        for k in sorted(da.keys() | db.keys()):
            if da.get(k) != db.get(k) and k not in cols:
                cols[k] = f"{k} ({da.get(k)} -> {db.get(k)})"
    return list(cols.values())


def tables_of(homes: dict[str, Path]) -> list[str]:
    """TABLES, then every other stored table either run wrote (a method's own: stage scores, reflections, mu's
    labels, guided steps, ...), except the stage log, which holds only times and statuses."""
    written = {d.name for h in homes.values() for d in (h / "data").glob("*")
               if d.is_dir() and not d.name.startswith("_") and any(d.glob("run_id=*"))}
    return [*TABLES, *sorted(written - set(TABLES) - {"stage_runs", "runs"})]


def learn_declared_tables(homes: dict[str, Path]) -> None:
    """A table a run declared in its workspace (its ``_schema.parquet``, written as the run starts) that no method
    imported here registers (Co-ReAct's ``guided_steps`` under GRPO) is read with the schema the run declared."""
    import pyarrow.parquet as pq

    from arbor.storage.schemas import TableSet, register_tables, tables

    for h in homes.values():
        for f in sorted((h / "data").glob("*/_schema.parquet")):
            if f.parent.name not in tables():
                register_tables(TableSet(owner="a run's workspace", schemas={f.parent.name: pq.read_schema(f)}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="the git commit (or branch) to compare against")
    ap.add_argument("--profile", default="tiny-cpu")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="a config key: k=v (YAML value)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--judge", choices=("rules", "scripted"), default="rules",
                    help="the offline rules judge, or the scripted OpenAI-compatible server (one per side)")
    ap.add_argument("--leave-out", action="append", default=[], metavar="COLUMN",
                    help="a column the reference does not write (e.g. attempt_errors, added after it): compared "
                    "as absent on both sides, and said so")
    args = ap.parse_args(argv)
    leave_out = frozenset(args.leave_out)
    if leave_out:
        print(f"columns left out of the comparison: {', '.join(sorted(leave_out))}")
    import yaml

    sets = {**DEFAULTS, **{k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.sets)}}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as servers:
        old = Path(tmp) / "ref"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.ref], check=True,
                       capture_output=True)
        try:
            differ = 0
            from arbor.tasks.methods import resolve_method

            judge = {side: servers.enter_context(judge_server(tree, args.judge))
                     for side, tree in (("ref", old), ("tree", ROOT))}
            for m in args.methods:
                resolve_method(METHOD_SETS.get(m, {}).get("run.method", m))  # its tables and steps columns
                homes = {name: Path(tmp) / f"home-{name}" for name in ("ref", "tree")}
                train(old, homes["ref"], m, {**sets, **judge["ref"]}, args.profile)
                train(ROOT, homes["tree"], m, {**sets, **judge["tree"]}, args.profile)
                learn_declared_tables(homes)
                for t in tables_of(homes):
                    a, b = rows(t, m, homes["ref"], leave_out), rows(t, m, homes["tree"], leave_out)
                    same = a == b
                    differ += not same
                    print(f"{m:10s} {t:22s} {len(a):4d} rows at {args.ref}, {len(b):4d} here: "
                          f"{'same' if same else 'DIFFERENT in ' + ', '.join(differing_columns(a, b))}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], capture_output=True)
    print("all tables identical" if not differ else f"{differ} table(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
