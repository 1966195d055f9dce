"""Co-ReAct guidance: rubric-guided, verified steps at inference, and the rubric generator's training.

Defaults are the paper's (Kang et al., 2026, §3, App. A) unless the help text says otherwise.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from arbor.config.base import Section
from arbor.config.judge import JudgeRoleConfig


class RankJudgeConfig(JudgeRoleConfig):
    """One judge of the ranking council (§3.1, App. A): its own model, endpoint and key, each None inheriting the
    judge's ``rank_actions`` role (``judge.roles.rank_actions``, then ``judge.*``). ``api_key_env`` is the NAME of
    the environment variable that holds the key, never the key."""

    name: str | None = Field(None, description="what its rankings are stored under (branch_points.judge_ranks) and "
                             "what seeds its label shuffle; None: its model (offline rules judges: rules-1, ...)")
    rationale: bool = Field(True, description="the paper's: the judge reasons first and the ranking is read from "
                            "its final answer (rank_actions.v2, free text); false: a bare JSON ranking under the "
                            "role's schema (rank_actions.v1, arbor's, for small local judges that need "
                            "grammar-constrained output)")


def paper_rank_judges() -> list[RankJudgeConfig]:
    """The paper's council (App. A: J = 3 judges of different families), each at its vendor's OpenAI-compatible
    endpoint with its own key variable. Offline (judge.backend=rules) they are three rules judges."""
    return [
        RankJudgeConfig(model="claude-sonnet-4-5", base_url="https://api.anthropic.com/v1/",
                        api_key_env="ANTHROPIC_API_KEY"),
        RankJudgeConfig(model="gemini-2.5-pro", base_url="https://generativelanguage.googleapis.com/v1beta/openai/",
                        api_key_env="GEMINI_API_KEY"),
        # GPT-5 (a reasoning model) takes only its default temperature, 1, and its reply limit as
        # max_completion_tokens
        RankJudgeConfig(model="gpt-5", base_url="https://api.openai.com/v1", api_key_env="OPENAI_API_KEY",
                        temperature=1.0, reply_limit_field="max_completion_tokens"),
    ]


class GuidanceConfig(Section):
    # ---- guided inference (§3.3): inject, verify, retry
    mode: Literal["off", "co-react"] = Field(
        "off", description="co-react: before the agent's turns (guidance.steps) a step rubric is written and placed "
        "in the agent's context (loss-masked, outside the response budget), and the proposed action is verified "
        "against it (rollouts and evaluation)")
    steps: Literal["tool", "every"] = Field(
        "tool", description="tool (the paper's, §3.3): a rubric is written only before a turn that may call a tool "
        "(searches left, trajectory budget not reached) and only a proposed tool call is verified; an answer is not "
        "(the answer step). every: arbor's earlier variant, every turn including the answer is guided and verified")
    source: Literal["generator", "memory", "judge"] = Field(
        "judge", description="who writes the step rubric: a trained generator checkpoint (guidance.generator), an "
        "exported ARBOR common pool (guidance.memory_pool), or the judge endpoint's step_rubric role (prompt-only)")
    verify: bool = Field(True, description="verify each proposed action and retry a failed one; false: inject only "
                         "(the paper's plug-in variant, §4.6)")
    tau: float = Field(0.5, ge=0.0, le=1.0, description="tau: an action passes when its weighted share of satisfied "
                       "items exceeds tau (strictly)")
    max_retries: int = Field(1, ge=0, le=3, description="re-plans of a step that failed verification, with the "
                             "verifier's feedback in context; the retried action replaces the failed one")
    retry_feedback: Literal["verifier", "items"] = Field(
        "verifier", description="what the retry reads besides the rubric: verifier (the paper's, §3.3): the unmet "
        "items and the verifier's own written feedback; items: the unmet items' names only (arbor's earlier)")
    trajectory_tokens: int | None = Field(
        6000, ge=1, description="guided inference (arbor eval with guidance): once the trajectory (the agent's "
        "tokens and results, rubrics not counted) reaches this many tokens the agent is handed over to an answer "
        "step: no more searches (App. A: 6,000, for both the guided and the unguided answers of the comparison); "
        "null: the rollout budgets only. Never applied to training rollouts")
    agent_temperature: float | None = Field(
        0.0, ge=0.0, description="guided inference (arbor eval with guidance): the agent's sampling temperature for "
        "both the guided and the unguided answers of the comparison; 0: greedy (the paper's agent, §4.1, App. A); "
        "null: eval.temperature (or rollout.temperature). Training rollouts always sample at rollout.temperature")
    max_history_chars: int | None = Field(
        None, ge=200, description="what of the agent's history h_t the rubric source and the verifier read (and a "
        "branching point stores). null (the paper's, §3.1-3.3: they condition on the whole prefix h_t): all of it; "
        "each judge role still compacts it to judge.max_judge_tokens (llm.text.compact_trajectory). A number "
        "(arbor's bound, e.g. for a small generator's context): the prefix compacted to about this many characters "
        "the same way (tags, queries and answers kept, result bodies elided first)")
    generator: str | None = Field(None, description="source=generator: a generator checkpoint directory (written by "
                                  "arbor-guidance-train) or a Hugging Face model id")
    generator_temperature: float = Field(0.7, ge=0.0, description="the generator samples at T = 0.7 (App. A)")
    generator_top_p: float = Field(0.95, gt=0.0, le=1.0, description="and top-p 0.95 (App. A)")
    max_rubric_tokens: int = Field(1024, ge=8, description="new tokens the generator may write per rubric (1,024 in "
                                   "App. A)")
    memory_pool: str | None = Field(None, description="source=memory: an exported common pool (JSON from `arbor "
                                    "rubrics export RUN`)")
    memory_pick: Literal["top", "retrieve"] = Field(
        "top", description="source=memory: the pool's rubrics with the highest rho_r, or those most similar to the "
        "question and history (token overlap)")
    memory_items: int = Field(4, ge=1, le=8, description="source=memory: items per step rubric (3-5 in the paper); "
                              "weights are proportional to max(rho_r, 0.1), summing to 1")
    # ---- generator training (§3.1, §3.2, App. A)
    branch_questions: int | None = Field(64, ge=1, description="training questions whose trajectories give "
                                         "branching points (a seeded sample of data.train; None: all of it)")
    branch_steps: Literal["tool", "every"] = Field(
        "tool", description="which turns of a branching trajectory are branching points. tool (the paper's, §3.1: "
        "'at every tool-calling step'; App. A discards points that have emitted a final answer): a turn whose own "
        "action called the search tool while searches were left, so the answering turn is not one. every: arbor's "
        "earlier variant, every turn including the answer")
    rank_golds: bool = Field(
        False, description="whether the ranking council sees the training question's gold answers. false (the "
        "paper's, §3.1, App. A: the judges rank from the query, the prefix h_t and the slate; DR Tulu's research "
        "queries carry no answer key, and the agent never has one at inference): no reference answer. true: "
        "arbor's earlier variant, the golds shown as the reference answer")
    branch_temperatures: list[Annotated[float, Field(ge=0.0)]] = Field(
        default_factory=lambda: [0.1, 0.4, 0.7, 1.0], min_length=1, description="candidate next actions are sampled at each of "
        "these temperatures (App. A), branch_samples each")
    branch_samples: int = Field(3, ge=1, description="candidates per temperature at a branching point (the paper "
                                "mixes three agents: 3 x 4 = 12)")
    slate_k: int = Field(4, ge=2, le=8, description="k: diverse candidates kept per branching point (MMR over BM25)")
    rank_judges: list[RankJudgeConfig] = Field(
        default_factory=paper_rank_judges, min_length=1, description="the council that ranks each slate list-wise "
        "(§3.1): one entry per judge, each with its own model, base_url and api_key_env (None: the judge's "
        "rank_actions role); default: the paper's three (Claude Sonnet 4.5, Gemini 2.5 Pro, GPT-5), offline three "
        "rules judges. An entry {} is the judge endpoint's own rank_actions role")
    min_rankings: int = Field(2, ge=1, description="a branching point is kept when at least this many judges returned "
                              "a valid ranking (the paper's 2; at most the number of rank_judges)")
    group_size: int = Field(8, ge=2, description="G: rubrics sampled per branching point")
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0, description="GRPO clip epsilon, in (0, 1): the ratio is clipped to "
                            "[1 - eps, 1 + eps]")
    kl_coef: float = Field(5e-3, ge=0.0, description="beta: KL to the frozen reference generator")
    lr: float = Field(2e-6, gt=0.0, description="the generator's learning rate")
    epochs: int = Field(2, ge=1, description="passes over the branching points")
    batch_points: int = Field(8, ge=1, description="branching points per GRPO update")
    grad_clip: float = Field(1.0, gt=0.0, description="gradient-norm clip")
    warm_start: bool = Field(True, description="SFT the generator on the judge's own step rubrics at the kept "
                             "branching points before GRPO (a tiny model cannot write the format unprompted; the "
                             "paper starts from Qwen3-14B, which can)")
    warm_epochs: int = Field(3, ge=1, description="epochs of that warm-start SFT (its other settings: sft.*)")
    generator_init: str | None = Field(None, description="the generator's start checkpoint; null: the policy's "
                                       "start checkpoint (the paper starts from the base model, Qwen3-14B)")

    @model_validator(mode="before")
    @classmethod
    def _rank_models(cls, data: Any) -> Any:
        """``rank_models`` (a list of model names, as older configs give it) reads as the council it meant: the judge's
        own rank_actions role, then one judge per name on the same endpoint."""
        if isinstance(data, dict) and "rank_models" in data:
            data = dict(data)
            models = data.pop("rank_models") or []
            if "rank_judges" in data:
                raise ValueError("guidance.rank_models: replaced by guidance.rank_judges; set only rank_judges")
            if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
                raise ValueError("guidance.rank_models: a list of model names (now guidance.rank_judges)")
            data["rank_judges"] = [{}] + [{"model": m} for m in models]
            data["min_rankings"] = min(int(data.get("min_rankings", 2)), len(data["rank_judges"]))  # was capped
        return data

    @model_validator(mode="after")
    def _council(self) -> GuidanceConfig:
        if self.min_rankings > len(self.rank_judges):
            raise ValueError(f"guidance.min_rankings: {self.min_rankings} valid rankings asked of "
                             f"{len(self.rank_judges)} judge(s) in guidance.rank_judges; lower it or add judges")
        names = [j.name for j in self.rank_judges if j.name is not None]
        if len(names) != len(set(names)):
            raise ValueError(f"guidance.rank_judges: names must differ (got {sorted(names)})")
        return self
