"""What every rollout engine shares (streamed groups): the agent states of K samples per
question and their seeds, scoring a finished state into a ``Trajectory``, reporting each group as its last row
ends, and the guide a rollout can run under (Co-ReAct's guided turns)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from arbor.config import ArborConfig
from arbor.format import ARBOR, TagProtocol, get_protocol
from arbor.reward import RewardFn, load_reward_fn, score_trajectory
from arbor.seeding import derive_seed
from arbor.tasks.env.agent import AgentLoop, AgentState, Budgets
from arbor.types import Trajectory


def trajectory_seed(seed: int, step: int, group: int, sample: int) -> int:
    """The seed of one trajectory: derived from (run seed, step, group, sample); turn t uses (this, "turn", t)."""
    return derive_seed(seed, step, group, sample, "rollout")


def to_trajectory(s: AgentState, *, run_id: str, step: int, group: int, sample: int, policy_version: int,
                  reward_fn: RewardFn | None = None, format_gate: bool = True,
                  protocol: TagProtocol = ARBOR) -> Trajectory:
    """A scored ``Trajectory`` from a finished agent state (``reward_fn``: the ``reward.fn`` plug-in)."""
    traj = Trajectory(
        run_id=run_id, step=step, group=group, sample=sample, question_id=s.question_id, question=s.question,
        golds=list(s.golds), prompt_ids=list(s.prompt_ids), response_ids=list(s.response_ids),
        loss_mask=list(s.loss_mask), rollout_logprobs=list(s.logprobs), text=s.text, turns=len(s.turns),
        search_calls=s.search_calls, search_queries=list(s.search_queries), finish_reason=s.finish_reason or "",
        policy_version=policy_version, gen_seconds=s.gen_seconds,
    )
    return score_trajectory(traj, truncated=s.truncated, reward_fn=reward_fn, format_gate=format_gate,
                            protocol=protocol)


class GroupWatch:
    """Calls ``on_group`` with a group's K trajectories as soon as its last row ends (streamed judging);
    ``flush`` reports the groups not reported yet (rows that never ran, a path without per-row reports)."""

    def __init__(self, engine: EngineBase, states: Sequence[AgentState], k: int, step: int, run_id: str,
                 first_group: int, on_group: Callable[[list[Trajectory]], None] | None) -> None:
        self.engine, self.states, self.k, self.step, self.run_id = engine, states, k, step, run_id
        self.first_group, self.on_group = first_group, on_group
        self.index = {id(s): j for j, s in enumerate(states)}
        self.left = [k] * (len(states) // k)

    def done(self, s: AgentState) -> None:
        g = self.index[id(s)] // self.k
        self.left[g] -= 1
        if self.left[g] == 0:
            self._report(g)

    def _report(self, g: int) -> None:
        self.left[g] = -1
        if self.on_group is not None:
            self.on_group(self.engine._finish(list(self.states[g * self.k:(g + 1) * self.k]), self.k, self.step,
                                              self.run_id, self.first_group + g))

    def flush(self) -> None:
        for g, n in enumerate(self.left):
            if n >= 0:
                self._report(g)


OnGroup = Callable[[list[Trajectory]], None]


class RolloutGuide(Protocol):
    """What an engine's rollouts can run under instead of plain turns (Co-ReAct's guided turns:
    ``tasks.methods.coreact.guidance.CoReAct``). The engine hands it its states (``run``); whoever owns the run
    sets the judge-ledger context of the calls to come (``set_context``) and takes one record per guided turn
    (``drain_records``)."""

    def run(self, engine: Any, states: Sequence[AgentState], keys: Sequence[tuple[int, int]]) -> None: ...

    def set_context(self, ctx: Any, **columns: Any) -> None: ...

    def drain_records(self) -> list[dict[str, Any]]: ...


class EngineBase:
    policy_version: int = 0
    guide: RolloutGuide | None = None  # guided turns (Co-ReAct: inject, verify, retry) instead of plain ones

    def _guided_groups(self, questions: Sequence[Any], k: int, seed: int, step: int, run_id: str,
                       first_group: int) -> list[Trajectory]:
        """``generate_groups`` under ``guide``: turn by turn, each round waiting for the rubric writer and verifier."""
        states = self._start_states(questions, k, seed, step, first_group)
        self.guide.run(self, states, [(first_group + j // k, j % k) for j in range(len(states))])
        return self._finish(states, k, step, run_id, first_group)

    def __init__(self, cfg: ArborConfig, tokenizer: Any, search: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.search = search
        self.reward_fn = load_reward_fn(cfg.reward)
        self.loop = AgentLoop(tokenizer, search, Budgets.from_config(cfg.rollout, cfg.search),
                              system_prompt=cfg.rollout.system_prompt,
                              protocol=get_protocol(cfg.rollout.protocol))

    def _start_states(self, questions: Sequence[Any], k: int, seed: int, step: int,
                      first_group: int = 0) -> list[AgentState]:
        return [self.loop.start(q.question_id, q.question, q.golds, trajectory_seed(seed, step, first_group + g, i),
                                getattr(q, "reference", ""))
                for g, q in enumerate(questions) for i in range(k)]

    def _finish(self, states: list[AgentState], k: int, step: int, run_id: str,
                first_group: int = 0) -> list[Trajectory]:
        return [to_trajectory(s, run_id=run_id, step=step, group=first_group + j // k, sample=j % k,
                              policy_version=self.policy_version, reward_fn=self.reward_fn,
                              format_gate=self.cfg.reward.format_gate, protocol=self.loop.protocol)
                for j, s in enumerate(states)]


def report_all(trajs: list[Trajectory], k: int, on_group: OnGroup | None) -> list[Trajectory]:
    """Guided rollouts advance turn by turn for the whole batch: every group is reported at the end."""
    if on_group is not None:
        for i in range(0, len(trajs), k):
            on_group(trajs[i:i + k])
    return trajs
