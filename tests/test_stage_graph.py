"""Every method declares its stage graph once: the pipeline's rollout, shape and train, and the
stages it adds between them, each with the tables it stores."""

from __future__ import annotations

import pytest

from arbor.config import load_config
from arbor.tasks.methods import BUILTIN, resolve_method
from arbor.tasks.methods.base import ROLLOUT, SHAPE, TRAIN, Method, Stage, check_hooks, check_stages


def test_the_built_in_graphs() -> None:
    graphs = {name: resolve_method(name).stage_names() for name in BUILTIN}
    assert graphs == {
        "grpo": ("rollout", "shape", "train"), "dapo": ("rollout", "shape", "train"),
        "rar": ("rollout", "shape", "train"),
        "arbor": ("rollout", "score", "retire", "induce", "shape", "consolidate", "train"),
        "no-memory": ("rollout", "induce", "shape", "train"),
        "ss-grpo": ("rollout", "score", "shape", "train"),
        "rubricem": ("rollout", "score", "reflect", "shape", "train"),
        "arco": ("rollout", "score", "shape", "mu_update", "train"),
    }
    for name in BUILTIN:
        cls = resolve_method(name)
        check_stages(cls.stages, name)
        method = cls(load_config("tiny-cpu", {"run.method": name, **cls.requires}))
        check_hooks(method, name)
        hooks = method.stage_hooks()  # every stage between rollout and train runs a bound hook of this method's
        assert list(hooks) == [s for s in graphs[name] if s not in ("rollout", "train")], name
        assert all(getattr(h, "__self__", None) is method for h in hooks.values()), name
    assert resolve_method("rubricem").stage("rollout").tables == ("rollouts", "bank_retrievals")
    assert resolve_method("arco").stage("shape").tables == ("trajectories", "turn_advantages")


def test_a_malformed_graph_is_refused_naming_the_method() -> None:
    for stages, words in [
        ((SHAPE, TRAIN), "must start with rollout"),
        ((ROLLOUT, TRAIN), "include shape"),
        ((ROLLOUT, SHAPE, TRAIN, Stage("score", ("rubric_events",))), "end with train"),
        ((ROLLOUT, SHAPE, SHAPE, TRAIN), "declared twice"),
        ((ROLLOUT, Stage("diversity", ("no_such_table",)), SHAPE, TRAIN), "no_such_table"),
    ]:
        with pytest.raises(ValueError, match=words) as e:
            check_stages(stages, "mine")
        assert str(e.value).startswith("method mine:")
    with pytest.raises(KeyError, match="has no stage 'score'"):
        Method.stage("score")


def test_a_stage_without_its_hook_or_a_hook_without_its_stage_is_refused() -> None:
    """``check_hooks`` (run at RunState's start): a declared stage must name the function it runs, and a hook
    must belong to a declared stage, so the step's call sites are the hook maps a reader finds."""
    from arbor.tasks.methods.grpo import GRPO

    cfg = load_config("tiny-cpu")

    class Forgot(GRPO):
        stages = (ROLLOUT, Stage("diversity", ("rubric_events",)), SHAPE, TRAIN)

    class Stray(GRPO):
        def stage_hooks(self):  # type: ignore[no-untyped-def]
            return {**super().stage_hooks(), "retire": self.shape}

    with pytest.raises(ValueError, match=r"method mine: stages \['diversity'\] have no hook"):
        check_hooks(Forgot(cfg), "mine")
    with pytest.raises(ValueError, match=r"names \['retire'\], which its stages"):
        check_hooks(Stray(cfg), "mine")
    check_hooks(GRPO(cfg), "grpo")


def test_only_a_method_with_a_pool_reports_one() -> None:
    """The step's log line and trackers ask the method (``summary``); ARBOR owns its memory, GRPO has none."""
    cfg = load_config("tiny-cpu")
    assert resolve_method("arbor")(cfg).summary() == {"rubric/pool_size": 0.0, "pool": "(empty)"}
    assert resolve_method("grpo")(cfg).summary() == {}
