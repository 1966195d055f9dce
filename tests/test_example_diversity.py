"""The seam: ``examples/diversity.py`` adds one stage and one table without touching arbor. Its
scores by hand; two steps of it shape rewards with them; a SIGKILL halfway through step 2's diversity stage resumes
to exactly the uninterrupted run's rows; another process's catalog views its table and view."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_support import table, tiny_overrides, train_until_killed

from examples.diversity import DiversityGRPO, diversity_scores, jaccard

RUN = "diversity"
METHOD = "examples.diversity:DiversityGRPO"


def test_diversity_by_hand() -> None:
    assert jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)
    assert jaccard(set(), set()) == 1.0
    # "a b" and "A b" share both words; "c d" shares none: d = 1 - (1 + 0) / 2 and 1 - (0 + 0) / 2
    assert diversity_scores(["a b", "A b", "c d"]) == pytest.approx([0.5, 0.5, 1.0])
    assert diversity_scores(["x y", "y z"]) == pytest.approx([1 - 1 / 3, 1 - 1 / 3])
    assert diversity_scores(["alone"]) == [0.0]


def test_the_method_declares_its_stage_and_table() -> None:
    from arbor.storage.schemas import OWNER, schema_for

    assert DiversityGRPO.stage_names() == ("rollout", "diversity", "shape", "train")
    assert OWNER["group_diversity"] == "grpo-diversity" and "diversity" in schema_for("group_diversity").names


def _overrides(start: Path) -> dict:
    return {**tiny_overrides(start), "run.method": METHOD, "rollout.batch_size": 4, "memory.delta_v": 0.0}


def _train(home: Path, overrides: dict, resume: bool = False) -> None:
    from arbor.flows.train import arbor_train

    os.environ["ARBOR_HOME"] = str(home)
    arbor_train(profile="tiny-cpu", overrides=overrides, run_id=RUN, resume=resume)


def _stored(home: Path) -> tuple:
    def rows(name: str) -> list[tuple]:
        return sorted(tuple(sorted((k, repr(v)) for k, v in r.items() if k not in ("completed_at", "wall_seconds",
                                                                                  "gen_seconds")))
                      for r in table(name, RUN, home))
    return rows("group_diversity"), rows("trajectories"), rows("steps")


@pytest.fixture(scope="module")
def reference(sft_policy: Path, prefect_harness, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("diversity_ref")
    _train(home, _overrides(sft_policy))
    return home


@pytest.mark.slow
def test_two_steps_store_and_shape_with_diversity(reference: Path) -> None:
    trajs = {t["traj_id"]: t for t in table("trajectories", RUN, reference)}
    stored = table("group_diversity", RUN, reference)
    assert len(stored) == len(trajs) == 2 * 4 * 4
    moved = compared = 0
    invalid: list[dict] = []
    for step in (1, 2):
        for g in range(4):
            mine = sorted((r for r in stored if (r["step"], r["group"]) == (step, g)), key=lambda r: r["sample"])
            texts = [trajs[r["traj_id"]]["text"] for r in mine]
            assert [r["diversity"] for r in mine] == pytest.approx(diversity_scores(texts))
            group = [trajs[r["traj_id"]] for r in mine]
            moved += any(t["shaped_reward"] != pytest.approx(t["base_reward"]) for t in group)
            # the more diverse response gains relative to the less diverse one; a format-invalid response keeps its
            # base reward exactly (shaping skips it), so only valid ones are compared
            valid = [(r["diversity"], t) for r, t in zip(mine, group, strict=True) if t["format_valid"]]
            invalid += [t for t in group if not t["format_valid"]]
            if len(valid) > 1 and max(v[0] for v in valid) - min(v[0] for v in valid) > 1e-9:
                hi, lo = max(valid, key=lambda v: v[0])[1], min(valid, key=lambda v: v[0])[1]
                compared += 1
                assert (hi["shaped_reward"] - hi["base_reward"]) > (lo["shaped_reward"] - lo["base_reward"])
    assert moved and compared  # the reward of some group was shaped by its diversity
    assert invalid and all(t["shaped_reward"] == t["base_reward"] for t in invalid)


@pytest.mark.slow
def test_sigkill_mid_stage_resumes_exactly(reference: Path, sft_policy: Path, tmp_path: Path,
                                           prefect_harness) -> None:
    home = tmp_path / "home"
    o = _overrides(sft_policy)
    train_until_killed(home, RUN, o, "2:diversity:kill-mid", tmp_path / "killed.log")
    assert {r["step"] for r in table("group_diversity", RUN, home)} == {1}  # step 2's stage never committed
    _train(home, o, resume=True)
    assert _stored(home) == _stored(reference)
    # a process that never imported the example still sees its table and view in the workspace catalog
    code = ("import sys; from arbor.storage.sql import query; "
            "print(query('select n_groups from diversity_by_step order by step', home=sys.argv[1]).to_pylist())")
    got = subprocess.run([sys.executable, "-c", code, str(home)], capture_output=True, text=True, cwd="/")
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.strip() == "[{'n_groups': 4}, {'n_groups': 4}]"
