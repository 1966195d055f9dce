"""Plain data records that flow between pipeline stages (docs/architecture.md). No logic beyond derived ids."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass
class Trajectory:
    """One sampled agent trajectory tau_i of a query-group G_q (paper §3.1).

    Token lists cover the *response* (everything the agent loop appended after the prompt): policy tokens
    (loss_mask 1) and tool-result / forced-message tokens (loss_mask 0, rollout_logprobs 0.0).
    """

    run_id: str
    step: int
    group: int  # index of the query-group within the step's batch
    sample: int  # index within the group, 0..K-1
    question_id: str
    question: str
    golds: list[str]
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    text: str = ""  # decoded response: think / search / result / answer turns
    turns: int = 0
    search_calls: int = 0
    search_queries: list[str] = field(default_factory=list)
    finish_reason: str = ""  # "answer" | "length" | "max_turns" | "stop" ...
    format_valid: bool = False
    format_reason: str = ""  # why the strict format checker refused it ("" when valid)
    answer: str | None = None
    em: float = 0.0
    f1: float = 0.0
    base_reward: float = -1.0
    shaped_reward: float | None = None
    policy_version: int = 0
    gen_seconds: float = 0.0
    # segment credit for the trainer: RubricEM's stages (where each stage starts among the response
    # tokens, and its score) or ARCO's turns (where each policy turn starts, and its advantage A_t)
    stage_starts: list[int] | None = None
    stage_rewards: list[float] | None = None

    @property
    def traj_id(self) -> str:
        return f"{self.run_id}/{self.step}/{self.group}/{self.sample}"

    @property
    def response_tokens(self) -> int:
        return len(self.response_ids)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["traj_id"] = self.traj_id
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Trajectory:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in row.items() if k in names})


RubricKind = Literal["draft", "common"]


@dataclass(frozen=True)
class Rubric:
    """A natural-language process rubric (paper §3.2, App. E.1): what high- and low-scoring responses do.

    ``feature``/``direction`` are set by the offline ``rules`` judge only: the machine-checkable process feature
    the rubric talks about and whether more of it is better (+1) or worse (-1). LLM rubrics leave them empty.
    """

    rubric_id: str
    title: str
    description: str
    counter_description: str
    kind: RubricKind = "draft"
    feature: str | None = None
    direction: int = 0


@dataclass(frozen=True)
class RubricDraft:
    """What a judge returns for induction / consolidation, before memory assigns an id."""

    title: str
    description: str
    counter_description: str
    feature: str | None = None
    direction: int = 0


StagePolarity = Literal[1, -1]


@dataclass(frozen=True)
class StageRubricDraft:
    """A stage rubric a judge proposes by contrasting a group (RubricEM App. C.2), before the buffer names it.

    ``stage``: 1 Plan, 2 Research, 3 Review, 4 Answer. ``weight``: 1 minor, 2 important, 3 critical.
    ``polarity``: +1 a quality to exhibit, -1 a flaw to avoid (scored 0/1/2 for how much of the flaw is there and
    inverted when aggregated). ``feature`` is set by the offline ``rules`` judge only (the stage feature it reads).
    """

    stage: int
    title: str
    description: str
    weight: int = 2
    polarity: int = 1
    feature: str | None = None


@dataclass(frozen=True)
class StageRubric:
    """A rubric in a question's stage buffer (App. C.1): adaptive, or ``persistent`` (never pruned)."""

    rubric_id: str
    stage: int
    title: str
    description: str
    weight: int = 2
    polarity: int = 1
    persistent: bool = False
    feature: str | None = None


@dataclass(frozen=True)
class RubricGrade:
    """One rubric's grade of one trajectory (App. C.3): 0 absent / 1 partial / 2 full (for a negative rubric: how
    fully the flaw is present), with the judge's short justification."""

    score: int
    justification: str = ""


@dataclass(frozen=True)
class ReflectionGrade:
    """The judge's grade of one reflection candidate (App. D.6.2), each dimension in [0, 1]."""

    diagnosis: float
    specificity: float
    scope: float


@dataclass(frozen=True)
class RubricItem:
    """One weighted condition of a Co-ReAct step rubric: "[weight] condition" (a negative weight marks a flaw)."""

    weight: float
    condition: str


@dataclass(frozen=True)
class StepRubric:
    """Co-ReAct's step rubric (its §3.2, §3.3): 3-5 weighted conditions the next action should meet and one
    recommended action, written for one branching point (question, history so far)."""

    items: tuple[RubricItem, ...]
    action: str = ""


@dataclass(frozen=True)
class StepVerdict:
    """A verifier's reading of one proposed action against a step rubric (Co-ReAct §3.3): one verdict per item in
    the rubric's order (for a negative item: whether the flaw is present) and short feedback on what is unmet."""

    satisfied: tuple[bool, ...]
    feedback: str = ""


@dataclass(frozen=True)
class StepLabel:
    """A teacher's reading of one step of a trajectory (ARCO's warm-up): K criteria and a score in [-1, 1] for
    each (how well the step meets it), before the projection that makes the steps add up to the outcome."""

    criteria: tuple[str, ...]
    scores: tuple[float, ...]



@dataclass(frozen=True)
class LossSettings:
    """The policy loss's fixed choices for a whole run, decided by the controller (the method) and handed to the
    trainer when it is built: the upper PPO clip and the KL term's initial coefficient and
    reference (``frozen``: the start checkpoint, loaded once more; ``old``: pi_old), and how the per-token losses
    are averaged (``loss_agg``)."""

    eps_clip_high: float
    kl_coef: float
    kl_reference: Literal["old", "frozen"]
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"  # tasks.training.losses


@dataclass
class UpdateBatch:
    """One policy update as the controller sends it to the trainer: the trajectories to train on
    (tokens, loss masks, behaviour log-probs, their policy versions), one advantage per response token of
    each, how many policy versions behind the trainer each was sampled, and this update's KL coefficient.
    ``metrics``: the controller's figures about the choice (groups, groups kept), returned with the trainer's.
    ``phases``: each trajectory's update phase (default: all 0, one phase). Phases run in ascending order, each its
    own pi_old, token-mean and optimiser steps (RubricEM: reflections in phase 0 = Alg. 1 line 10, the task batch
    in phase 1 = line 29)."""

    trajectories: list[Trajectory]
    advantages: list[Any]  # torch.Tensor, one value per response token
    versions_behind: list[int]
    kl_coef: float
    metrics: dict[str, float] = field(default_factory=dict)
    phases: list[int] | None = None
    # the temperature each trajectory is scored at (None: the trainer's, the rollout temperature); one per phase
    temperatures: list[float | None] | None = None

    def phase_indices(self) -> list[list[int]]:
        """The trajectories' indices per phase, phases in ascending order."""
        ph = self.phases if self.phases is not None else [0] * len(self.trajectories)
        if len(ph) != len(self.trajectories):
            raise ValueError(f"{len(ph)} update phases for {len(self.trajectories)} trajectories")
        return [[i for i, p in enumerate(ph) if p == q] for q in sorted(set(ph))]

    def phase_temperature(self, members: list[int]) -> float | None:
        """The scoring temperature of one phase (its trajectories must agree)."""
        temps = {self.temperatures[i] for i in members} if self.temperatures is not None else {None}
        if len(temps) > 1:
            raise ValueError(f"one update phase mixes scoring temperatures {sorted(temps, key=str)}")
        return temps.pop() if temps else None
