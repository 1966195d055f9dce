"""The method interface: the stages a training method runs in an RL step and its decisions (docs/architecture.md).

A method declares its stage graph once (``Method.stages``): the pipeline's own stages (``rollout``, ``shape``,
``train``) and, between them, the stages it adds, each with the tables it stores. Plain GRPO runs

    rollout ─► shape ─► train

and ARBOR (``tasks.methods.arbor``) adds its rubric memory's four:

    rollout ─► score ─► retire ─► induce ─► shape ─► consolidate ─► train

The flow runs whatever graph the method declares; the stage machinery (storage, resume, timing, metrics) belongs
to ``tasks.step.RunState``. What a method stores beyond the pipeline's tables, it declares as a
``storage.schemas.TableSet`` (``Method.tables``: its tables and schemas, its ``steps`` columns, its SQL views),
registered with the store when its class is defined. Each stage between rollout and train runs the hook
``stage_hooks`` maps it to, ``hook(run, step, trajs)`` (trajs: the step's rollouts), returning the rows of its
declared tables: the step's call sites, in order, in one place per method. The decisions
inside the pipeline's stages are twenty hooks with plain GRPO's defaults:

    batch               the step's questions and what the prompt shows before each (RubricEM: curriculum, bank items)
    extra_rollouts      more groups after the batch's (DAPO's dynamic sampling)
    prefetch            a group's judge calls, made while other groups still roll out (ARBOR: scoring, induction)
    rubric_scores       per group, the rubric score vectors that eq. 3/4 shape the base reward with
    shape               R_total per trajectory (default: eq. 3/4 with ``rubric_scores``; SS-GRPO: stage returns)
    train_batch         what the trainer gets besides the shaped rollouts (RubricEM: last step's reflections)
    update_rewards      R_i, the reward each trajectory's advantage is computed from (default: R_total, else
                        R_base; DAPO: plus its overlong punishment, eq. 13)
    policy_lag          how many steps old a trajectory of the train batch may be (RubricEM's reflections: 1)
    select_groups       which trajectories the trainer keeps (DAPO: drops zero-variance groups)
    token_advantages    one advantage per response token (GRPO: the group advantage A_i broadcast; a method with
                        stage- or turn-level credit returns different values along one trajectory)
    update_phase        the phase of the update a trajectory is trained in (RubricEM: reflections first)
    scoring_temperature the temperature a trajectory's tokens are scored at (RubricEM's reflections: theirs)
    loss_settings       the upper PPO clip and the KL term's coefficient and reference (DAPO: clip-higher; ``old``:
                        pi_old, ``frozen``: the start checkpoint), fixed when the trainer is built
    kl_coef_at          the coefficient at one step (ARCO: 0 in its sparse phase)
    after_train         once a step's policy update is committed (ARCO: mu's checkpoint with the policy's)
    step_metrics        the method's columns of the ``steps`` row (ARCO: mu's loss; DAPO: its shortfall)
    summary             what the step's log line and trackers show of the method's state (ARBOR: the common pool)
    console_lines       the method's rows in the console's step summary (ARBOR: the pool, the judge signal)
    sample_scores       the scores a sampled trajectory got, in the trackers' sample table (ARBOR: each rubric's)
    restore             rebuild the method's own state from stored rows when a run (re)starts (ARBOR: its memory)

The train-stage decisions run in the controller (``tasks.training.update.policy_update``): the trainer gets tensors and
knows no method. Hooks get the run's resources (``StepResources``) and must draw any randomness from ``run.seed``
and the step, so a resumed stage reproduces the stored one. A method is a class; ``tasks.methods.resolve_method``
finds the built-ins by name and a user's own by import path (``pkg.module:MyMethod``); docs/methods.md has a
worked example.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from arbor.config import ArborConfig
from arbor.config.train import TrainConfig
from arbor.llm.base import Judge
from arbor.storage.schemas import TableSet, register_tables
from arbor.storage.schemas import tables as known_tables
from arbor.tasks.env.datasets import Question, batch_for_step
from arbor.tasks.shaping import shape_group
from arbor.tasks.training.update import GRPORule, grpo_loss_settings
from arbor.types import LossSettings, Trajectory

Rows = list[dict[str, Any]]
T = TypeVar("T")


class StepResources(Protocol):
    """What a method may use during a stage (implemented by ``tasks.step.RunState``)."""

    cfg: ArborConfig
    run_id: str
    home: Any  # the workspace (pathlib.Path)
    trainer: Any  # the policy trainer: model_path (the start checkpoint), policy_version
    questions: list[Question]
    store: Any  # tasks.stages.StageStore: this run's stored stages (a method reads its own earlier rows)
    engine: Any  # a rollout engine: generate_groups(questions, k, seed, step, run_id=..., first_group=...)
    judge: Judge
    embed: Callable[[list[str]], Any]

    @property
    def seed(self) -> int: ...

    def groups(self, trajs: Sequence[Trajectory]) -> list[list[Trajectory]]: ...

    def trajectories(self, step: int, stage: str, table: str) -> list[Trajectory]: ...

    def rows(self, step: int, table: str) -> Rows: ...

    def judge_capped(self) -> bool: ...

    def judge_rows(self) -> Rows: ...

    def run_async(self, coro: Awaitable[T]) -> T: ...

    def scoring_progress(self, stage: str, total: int) -> Callable[[], None]: ...


@dataclass(frozen=True)
class Stage:
    """One stage of a step as a method declares it: its name (the pipeline's ``rollout`` and ``train``, else the
    key of the hook that runs it in ``Method.stage_hooks``), the tables its artifact holds, and how many times the
    flow retries it in place (only a stage that changes no in-process state before its commit may be retried)."""

    name: str
    tables: tuple[str, ...]
    retries: int = 0


# what a method's own stage runs: its rows from the step's rollouts (``Method.stage_hooks``)
StageHook = Callable[[StepResources, int, list[Trajectory]], dict[str, Rows]]

ROLLOUT = Stage("rollout", ("rollouts",), retries=1)
SHAPE = Stage("shape", ("trajectories", "judge_calls", "draft_scores"), retries=1)
TRAIN = Stage("train", ("steps",))


def check_stages(stages: Sequence[Stage], method: str) -> None:
    """A stage graph starts with ``rollout``, shapes before it trains, ends with ``train``, names each stage once,
    and every stored table is one the storage layer declares (``storage/schemas.py``)."""
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"method {method}: a stage is declared twice in {names}")
    if not names or names[0] != "rollout" or names[-1] != "train" or "shape" not in names:
        raise ValueError(f"method {method}: stages {names} must start with rollout, include shape and end with train")
    unknown = sorted({t for s in stages for t in s.tables} - set(known_tables()))
    if unknown:
        raise ValueError(f"method {method}: stage tables {unknown} are declared neither by the pipeline "
                         "(storage/schemas.py) nor by the method's TableSet (``Method.tables``)")


def check_hooks(method: Method, name: str) -> None:
    """Every stage the method declares between rollout and train has the hook that runs it (``stage_hooks``),
    and no hook is left without its stage."""
    own = [s.name for s in method.stages if s.name not in ("rollout", "train")]
    hooks = method.stage_hooks()
    if missing := [s for s in own if s not in hooks]:
        raise ValueError(f"method {name}: stages {missing} have no hook in stage_hooks() (its hooks: {sorted(hooks)})")
    if extra := sorted(set(hooks) - set(own)):
        raise ValueError(f"method {name}: stage_hooks() names {extra}, which its stages {list(own)} do not declare")


@dataclass
class RubricScores:
    """``rubric_scores``' answer: per group id, one score vector per rubric (None: that rubric failed for the
    group), the judge calls and audit rows (``draft_scores``) the shape stage stores, the shaping variance
    filter's delta_v (None: ``memory.delta_v``; RaR: 0, no filter) and the attenuation of negative centred scores
    (None: ``memory.alpha``; RaR with ``memory.rar_attenuate`` off: 1, none)."""

    per_group: dict[int, list[Sequence[float | None] | None]] = field(default_factory=dict)
    judge_calls: Rows = field(default_factory=list)
    draft_scores: Rows = field(default_factory=list)
    delta_v: float | None = None
    alpha: float | None = None


class Method(GRPORule):
    """Plain GRPO behaviour; a method overrides the hooks it changes (module docstring). The train decisions'
    defaults (``update_rewards``, ``policy_lag``, ``select_groups``, ``token_advantages``, ``update_phase``,
    ``scoring_temperature``, ``kl_coef_at``) are ``tasks.training.update.GRPORule``'s."""

    name: ClassVar[str] = ""
    stages: ClassVar[tuple[Stage, ...]] = (ROLLOUT, SHAPE, TRAIN)  # the step's stage graph, in order
    requires: ClassVar[dict[str, object]] = {}  # dotted config key -> the value the method cannot run without
    tables: ClassVar[TableSet | None] = None  # the method's own tables, steps columns and views (its package's)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Defining a method registers what it stores: its tables are known to the store from then on."""
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("tables") is not None:
            register_tables(cls.tables)  # type: ignore[arg-type]

    def __init__(self, cfg: ArborConfig) -> None:
        self.cfg = cfg

    def restore(self, run: StepResources) -> None:
        """Rebuild state the method keeps between steps from stored rows (called when a run starts or resumes)."""

    # -------------------------------------------------------------------------------- stages (rollout -> shape)
    def batch(self, run: StepResources, step: int) -> tuple[list[Question], dict[str, Rows]]:
        """The step's questions (default: the seeded epoch stream, ``batch_for_step``) with what each prompt shows
        before its question (``Question.reference``), and rows the rollout stage stores with them."""
        return batch_for_step(run.questions, run.seed, step, self.cfg.rollout.batch_size), {}

    def extra_rollouts(self, run: StepResources, step: int, batch: list[Question],
                       trajs: list[Trajectory]) -> list[Trajectory]:
        return []

    async def prefetch(self, run: StepResources, step: int, group: list[Trajectory]) -> None:
        """Streamed judging: make, ahead of the stages, the judge calls they will make for this group of
        K finished trajectories (same arguments, same ``CallContext``); each stage then claims their answers in its
        own order. Runs while other groups still roll out, so it must not change any state (the memory is read
        only). Default: nothing ahead; every call is made by its stage."""

    def rubric_scores(self, run: StepResources, step: int, trajs: list[Trajectory]) -> RubricScores:
        """The score vectors each group is shaped with; a method reads what its own stages stored for the step
        (ARBOR: the score stage's activations). Default: none, R_total = R_base."""
        return RubricScores()

    def shape(self, run: StepResources, step: int, trajs: list[Trajectory]) -> dict[str, Rows]:
        """R_total = R_base + lambda_ * centred, attenuated rubric term (eq. 3/4), per group, with the scores
        ``rubric_scores`` gives each group (none: R_total = R_base)."""
        m = self.cfg.memory
        got = self.rubric_scores(run, step, trajs)
        delta_v = m.delta_v if got.delta_v is None else got.delta_v
        alpha = m.alpha if got.alpha is None else got.alpha
        out: Rows = []
        for g in run.groups(trajs):
            scores = got.per_group.get(g[0].group, [])
            shaped = shape_group([t.base_reward for t in g], scores, [t.format_valid for t in g],
                                 lambda_=m.lambda_, alpha=alpha, delta_v=delta_v, variance=m.variance)
            for t, total in zip(g, shaped.total, strict=True):
                t.shaped_reward = total
                out.append(t.to_row())
        return {"trajectories": out, "judge_calls": got.judge_calls, "draft_scores": got.draft_scores}

    # -------------------------------------------------------------------------------- the trainer's decisions
    def train_batch(self, run: StepResources, step: int, trajs: list[Trajectory]) -> list[Trajectory]:
        """What the trainer updates on at ``step``: the shaped rollouts (default), plus whatever the method adds
        from stored stages (RubricEM: the previous step's reflection candidates)."""
        return trajs

    def loss_settings(self, train: TrainConfig) -> LossSettings:
        """The run's upper PPO clip and KL term, fixed when the trainer is built (default: the configured ones;
        DAPO: clip-higher; SS-GRPO, ARCO: a KL term against the frozen start checkpoint)."""
        return grpo_loss_settings(train)

    def kl_coef_at(self, step: int, train: TrainConfig) -> float:
        """The KL coefficient of ``step``'s update (default: ``loss_settings``', every step)."""
        return self.loss_settings(train).kl_coef

    def after_train(self, run: StepResources, step: int, metrics: dict[str, float]) -> None:
        """Called once ``step``'s train stage is committed, beside the policy's checkpoint (not on a replay)."""

    def step_metrics(self, run: StepResources, step: int, train_metrics: dict[str, float]) -> dict[str, float | None]:
        """Values of the columns the method adds to the step's ``steps`` row (its ``tables.step_columns``)."""
        return {}

    def summary(self) -> dict[str, float | str]:
        """The method's state after a step, for the log line and the trackers (numbers) and the step's Prefect
        artifact (text). Default: nothing."""
        return {}

    def logged_metrics(self, run: StepResources, step: int) -> dict[str, float | None]:
        """What the trackers show of the method after ``step``, beside the figures every run logs
        (``tasks.step.tracked_metrics``). Default: the numbers of ``summary``."""
        return {k: float(v) for k, v in self.summary().items() if isinstance(v, int | float)}

    def stage_hooks(self) -> dict[str, StageHook]:
        """What each stage between rollout and train runs, by stage name: the step's call sites
        (``RunState.compute``). Default: ``shape`` (eq. 3/4). A method that declares a stage of its own adds it here;
        ``RunState`` refuses a declared stage without a hook."""
        return {"shape": self.shape}

    def sample_scores(self, run: StepResources, step: int) -> dict[tuple[int, int], str]:
        """The ``scores`` cell of the trackers' sample table, by (group, sample): what the method scored the
        trajectory with. Default: nothing."""
        return {}

    def console_lines(self, metrics: Mapping[str, float]) -> list[str]:
        """The method's rows in the console's step summary, under every run's figures, from the step's logged
        ``metrics`` (``Tracker.log``). Default: none."""
        return []

    def step_report(self, run: StepResources, step: int) -> str | None:
        """A markdown section on ``step`` for its Prefect artifact (``flows.train.publish_step``). Default: none."""
        return None

    @classmethod
    def stage_names(cls) -> tuple[str, ...]:
        return tuple(s.name for s in cls.stages)

    @classmethod
    def stage(cls, name: str) -> Stage:
        """The declared stage ``name`` (``KeyError`` naming the graph if the method has none)."""
        for s in cls.stages:
            if s.name == name:
                return s
        raise KeyError(f"method {cls.name or cls.__qualname__} has no stage {name!r} (its stages: "
                       f"{', '.join(cls.stage_names())})")

