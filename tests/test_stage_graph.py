"""Every method declares its stage graph once: the pipeline's rollout, shape and train, and the
stages it adds between them, each with the tables it stores."""

from __future__ import annotations

import pytest

from arbor.tasks.methods import BUILTIN, resolve_method
from arbor.tasks.methods.base import PIPELINE_STAGES, ROLLOUT, SHAPE, TRAIN, Method, Stage, check_stages


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
        for stage in cls.stages:  # every stage is the pipeline's or a hook of the method's own
            assert stage.name in PIPELINE_STAGES or callable(getattr(cls, stage.name, None)), \
                (name, stage.name)
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


def test_only_a_method_with_a_pool_reports_one() -> None:
    """The step's log line and trackers ask the method (``summary``); ARBOR owns its memory, GRPO has none."""
    from arbor.config import load_config

    cfg = load_config("tiny-cpu")
    assert resolve_method("arbor")(cfg).summary() == {"rubric/pool_size": 0.0, "pool": "(empty)"}
    assert resolve_method("grpo")(cfg).summary() == {}
