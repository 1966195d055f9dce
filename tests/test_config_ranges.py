"""Config values checked against their meaning: every float finite, every numeric field a declared range, the
ranges that follow from a quantity's definition at their boundaries, and the same checks on a resume's overrides."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from annotated_types import Ge, Gt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from arbor.config import ArborConfig, ConfigError, load_config
from arbor.config.resume import amend_config

Path_ = tuple[str | int, ...]
# numeric fields with no range, each for a reason
UNBOUNDED = {
    "run.seed": "a seed only names a random stream (hashed by arbor.seeding.derive_seed): any integer",
    "world.seed": "as run.seed",
    "arco.positive_threshold": "a cut on the outcome reward R, whose scale is the reward function's (reward.fn)",
    "rubricem.lambda_matrix": "its shape, unit diagonal and zeros below it are checked by its own validator",
}


def _types(ann: Any) -> list[Any]:
    """``ann`` and every type inside it (Optional, tuple, list, Annotated)."""
    out = [ann]
    for a in get_args(ann):
        out += _types(a)
    return out


def numeric_fields(model: type[BaseModel] = ArborConfig, path: Path_ = ()) -> list[tuple[Path_, FieldInfo]]:
    """(path, field) of every int- or float-valued field of the schema (sections and list items walked)."""
    out: list[tuple[Path_, FieldInfo]] = []
    for name, f in model.model_fields.items():
        kinds = _types(f.annotation)
        subs = [a for a in kinds if isinstance(a, type) and issubclass(a, BaseModel)]
        if subs:
            out += numeric_fields(subs[0], (*path, name, 0) if get_origin(f.annotation) is list else (*path, name))
        elif int in kinds or float in kinds:
            out.append(((*path, name), f))
    return out


def dotted(path: Path_) -> str:
    return ".".join(map(str, path))


def has_lower_bound(f: FieldInfo) -> bool:
    """A ``ge`` / ``gt`` on the field, or on the items of a tuple or list field."""
    found = list(f.metadata)
    for a in _types(f.annotation):
        for m in getattr(a, "__metadata__", ()):
            found += getattr(m, "metadata", [m])
    return any(isinstance(m, Ge | Gt) for m in found)


def poisoned(value: Any, x: float) -> Any:
    """``value`` with its first number replaced by ``x`` (a scalar becomes ``x``)."""
    if isinstance(value, list | tuple):
        return [poisoned(value[0], x), *value[1:]]
    return x


def override(path: Path_, x: float) -> tuple[str, Any]:
    """(key, value) that puts ``x`` into the field at ``path`` (below a list position: that item of the default)."""
    cut = next((i for i, p in enumerate(path) if isinstance(p, int)), len(path))
    whole: Any = ArborConfig().model_dump(mode="json")
    for p in path[:cut]:
        whole = whole[p]
    if cut == len(path):
        return dotted(path), poisoned(whole, x)
    node = whole
    for p in path[cut:-1]:
        node = node[p]
    node[path[-1]] = poisoned(node[path[-1]], x)
    return dotted(path[:cut]), whole


FIELDS = numeric_fields()
FLOATS = [p for p, f in FIELDS if float in _types(f.annotation)]


def test_the_walk_reaches_every_section() -> None:
    sections = {p[0] for p, _ in FIELDS}
    assert sections == set(ArborConfig.model_fields) - {"reward", "deviations"}  # the two without a number
    assert {"train.betas", "rubricem.reflection_weights", "guidance.branch_temperatures",
            "guidance.rank_judges.0.temperature", "judge.roles.pairwise.stall_s"} <= {dotted(p) for p in FLOATS}


@pytest.mark.parametrize("path", FLOATS, ids=dotted)
def test_every_float_refuses_inf_and_nan_by_name(path: Path_) -> None:
    for x in (math.inf, -math.inf, math.nan):
        with pytest.raises(ConfigError, match=dotted(path).replace(".", r"\.")):
            load_config("tiny-cpu", [override(path, x)])


def test_every_numeric_field_has_a_range_or_a_reason() -> None:
    missing = [dotted(p) for p, f in FIELDS if not has_lower_bound(f) and dotted(p) not in UNBOUNDED]
    assert missing == [], "give the field the range its meaning allows (ge / gt / le / lt), or list it with a reason"
    assert set(UNBOUNDED) <= {dotted(p) for p, _ in FIELDS}


@pytest.mark.parametrize(("refused", "named"), [
    (["memory.delta_v=0.26"], "memory.delta_v=0.26 is above 0.25"),  # population variance of [0, 1] scores <= 1/4
    (["memory.variance=sample", "memory.delta_v=0.29"], "above 0.285714"),  # K = 8: 0.25 * 8 / 7
    (["memory.variance=sample", "rollout.k=2", "memory.delta_v=0.51"], "memory.delta_v"),
    (["run.steps=0"], "run.steps"),
    (["rollout.k=1"], "rollout.k"),
    (["train.lr=.inf"], "train.lr"),
    (["train.lr=.nan"], "train.lr"),
    (["arco.positive_threshold=.nan"], "arco.positive_threshold"),
    (["memory.lambda_=.inf"], "memory.lambda_"),
    (["guidance.clip_eps=1"], "guidance.clip_eps"),
    (["guidance.branch_temperatures=[]"], "guidance.branch_temperatures"),
    (["guidance.branch_temperatures=[0.1, -0.4]"], "guidance.branch_temperatures.1"),
    (["rubricem.reflection_weights=[0.4, -0.3, 0.3]"], "rubricem.reflection_weights.1"),
    (["cluster.rollout_gpus=[-1]"], "cluster.rollout_gpus.0"),
])
def test_values_outside_their_meaning_are_refused(refused: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("tiny-cpu", refused)
    assert named in str(err.value), str(err.value)


def test_the_boundaries_themselves_load() -> None:
    cfg = load_config("tiny-cpu", ["memory.delta_v=0.25", "run.steps=1", "rollout.k=2", "guidance.clip_eps=0.99",
                                   "cluster.rollout_gpus=[0]"])
    assert (cfg.memory.delta_v, cfg.run.steps, cfg.rollout.k, cfg.guidance.clip_eps) == (0.25, 1, 2, 0.99)
    assert load_config("tiny-cpu", ["memory.variance=sample", "memory.delta_v=0.2857"]).memory.delta_v == 0.2857
    assert load_config("tiny-cpu", ["memory.variance=sample", "rollout.k=2", "memory.delta_v=0.5"]).rollout.k == 2


def _stored() -> ArborConfig:
    cfg = load_config("tiny-cpu")
    cfg.run.run_id = "r1"
    return cfg


@pytest.mark.parametrize("bad", ["run.steps=0", "judge.timeout_s=.inf", "judge.max_failed_share=.nan",
                                 "judge.cost_cap_usd=.inf", "judge.concurrency=0"])
def test_resume_overrides_out_of_range_are_refused_by_name(bad: str) -> None:
    stored = _stored()
    with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
        amend_config(stored, [bad])
    assert stored.run.steps == 5  # the stored config is not touched


def test_cli_resume_out_of_range_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """``arbor train --resume r1 --set run.steps=0``: exit 2, one line naming the key, the run's record and
    workspace as they were."""
    from arbor.storage.parquet import write_stage
    from arbor.storage.runs import run_row

    home = tmp_path / "home"
    env = {**os.environ, "ARBOR_HOME": str(home), "PREFECT_HOME": str(tmp_path / "prefect")}
    cfg = _stored()
    write_stage("runs", [{"profile": "tiny-cpu", "method": "arbor", "seed": 0, "config_json": cfg.to_json(),
                          "created_at": time.time()}], run_id="r1", step=0, stage="run", home=home)
    before = run_row("r1", home)
    files = {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()}
    for bad in ("run.steps=0", "judge.timeout_s=.inf"):
        out = subprocess.run([str(Path(sys.executable).parent / "arbor"), "train", "--resume", "r1", "--set", bad],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
        assert out.stderr.startswith(f"error: {bad.split('=')[0]}"), out.stderr
    assert run_row("r1", home) == before
    assert {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file() and p in files} == files
    assert not (tmp_path / "prefect").exists()
