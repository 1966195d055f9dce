"""Judge backends for induction, consolidation, pairwise judging, accuracy and the RaR roles (App. E)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from arbor.config.base import EnvName, Section, Url, builtin_or_plugin

# world / random: ARBOR's judge that reads the synthetic world's facts and its seeded-coin control
# (tasks/methods/arbor/world_judge.py), registered by their package (llm.register_backend)
JUDGE_BACKENDS = ("rules", "openai", "world", "random")


class JudgeRoleConfig(Section):
    """Optional per-role overrides (``judge.roles.pairwise.model=...``); None inherits the judge-wide value."""

    model: str | None = None
    base_url: Url | None = None
    api_key_env: EnvName | None = None
    temperature: float | None = Field(None, ge=0.0)
    max_tokens: int | None = Field(None, ge=1)
    reply_limit_field: Literal["max_tokens", "max_completion_tokens"] | None = None
    price_in_per_mtok: float | None = Field(None, ge=0.0)
    price_out_per_mtok: float | None = Field(None, ge=0.0)
    stall_s: float | None = Field(None, gt=0)


class JudgeRoles(Section):
    """Per-role overrides, e.g. ``--set judge.roles.pairwise.model=qwen-turbo``."""

    induction: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)  # also the unlabeled variant (App. A.1)
    consolidation: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)
    pairwise: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)
    accuracy: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)
    rar_rubrics: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)
    rar_rate: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)
    stage_rubrics: JudgeRoleConfig = Field(  # RubricEM App. C.2: up to 17 rubrics with descriptions in one reply
        default_factory=lambda: JudgeRoleConfig(max_tokens=2048))
    stage_grades: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)  # RubricEM App. C.3
    reflection_grades: JudgeRoleConfig = Field(default_factory=JudgeRoleConfig)  # RubricEM App. D.6.2
    step_labels: JudgeRoleConfig = Field(  # ARCO's teacher: k criteria and scores for every step of a trajectory
        default_factory=lambda: JudgeRoleConfig(max_tokens=2048))
    # Co-ReAct (App. A): the rubric writer samples at temperature 0.7 (the authors add top-p 0.95, which a role
    # config cannot set) with up to 1024 tokens a rubric; the verifier decodes greedily (temperature 0)
    step_rubric: JudgeRoleConfig = Field(default_factory=lambda: JudgeRoleConfig(temperature=0.7, max_tokens=1024))
    step_verify: JudgeRoleConfig = Field(default_factory=lambda: JudgeRoleConfig(temperature=0.0))
    # Co-ReAct §3.1, App. A: list-wise expert ranking, the ranking read from the final answer after a rationale
    # (room for both; guidance.rank_judges[i] may override it per judge)
    rank_actions: JudgeRoleConfig = Field(default_factory=lambda: JudgeRoleConfig(max_tokens=2048))


class JudgeConfig(Section):
    backend: str = Field("rules", description="rules (offline heuristics), openai (any OpenAI-compatible endpoint), "
                         "world (ARBOR's roles from the synthetic world's facts, never the gold answer), random (ARBOR's "
                         "roles by seeded coin flips: the control admission must filter), or a plug-in subclass of arbor.llm.Judge as 'pkg.module:Class' (docs/plugins.md)")
    model: str = "qwen-plus-2025-04-28"
    base_url: Url | None = None
    api_key_env: EnvName = Field("OPENAI_API_KEY", description="name of the environment variable holding the key")
    temperature: float = Field(0.0, ge=0.0)
    max_tokens: int = Field(1024, ge=1)
    reply_limit_field: Literal["max_tokens", "max_completion_tokens"] = Field(
        "max_tokens", description="the request field that carries max_tokens: max_tokens (llama.cpp, vLLM, most "
        "OpenAI-compatible servers) or max_completion_tokens (OpenAI's reasoning models, e.g. GPT-5, refuse "
        "max_tokens)")
    concurrency: int = Field(32, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    stall_s: float | None = Field(
        None, gt=0, description="seconds without a byte from the judge's server after which a request is a stall: "
        "not retried, the run ends naming the role and its URL (resumable). null: sized to the role's output "
        "budget, the request's timeout (judge.timeout_s per 2,048 tokens in and out: a non-streaming reply sends "
        "nothing until its last token)")
    max_retries: int = Field(4, ge=0, description="retries after the first attempt (transport errors and invalid output)")
    structured_outputs: Literal["auto", "json_schema", "json_object", "off"] = Field(
        "auto", description="send each role's JSON schema as response_format: json_schema (OpenAI, vLLM), "
        "json_object with a schema (llama-cpp-python's server), off, or auto: json_schema first, and on an "
        "endpoint that refuses it json_object, then none (logged once per endpoint)")
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(30.0, ge=0, description="the longest wait between attempts, a server's "
                                 "Retry-After (seconds or a date) included")
    max_judge_tokens: int | None = Field(
        3000, ge=256, description="arbor's per-trajectory cap (chars / 4 tokens): every trajectory a judge is shown "
        "is compacted to it (result bodies first). null: no cap, as ARBOR's prompts show it (App. E.1, E.3): each "
        "trajectory goes whole, results included, and is compacted only when the prompt, its K trajectories and "
        "the reply would not fit judge.context_tokens (which null requires)")
    context_tokens: int | None = Field(None, ge=2048, description="the judge's context window; set, every prompt's "
                                       "trajectories are compacted further so that they, the prompt and the reply "
                                       "fit it (a local 135M judge: its server's n_ctx; qwen-plus: 129,024 input "
                                       "tokens)")
    cost_cap_usd: float | None = Field(None, ge=0, description="per-run judge cost cap; past it: base reward only")
    max_failed_share: float = Field(
        1.0, ge=0.0, le=1.0, description="a judge role whose calls of one step failed in transport (timeout, stall, "
        "connection, an error status after the retries) at this share or more ends the run before the step commits, "
        "naming the role, its URL and the last error; resumable (default 1.0: when every call failed)")
    warn_refused_share: float = Field(
        0.5, ge=0.0, le=1.0, description="a judge role whose answers of one step were refused (unparseable, cut off, "
        "hollow) above this share marks the step degraded and prints a WARNING naming the commonest reason")
    price_in_per_mtok: float = Field(0.4, ge=0.0, description="USD per million prompt tokens")
    price_out_per_mtok: float = Field(1.2, ge=0.0, description="USD per million completion tokens")
    cache: bool = Field(True, description="content-hash response cache under {home}/cache/judge")
    roles: JudgeRoles = Field(default_factory=JudgeRoles, description="per-role overrides (None: inherit)")
    rules_tolerance: float = Field(
        0.15, ge=0.0, description="rules backend: relative feature difference inside which pairwise is a TIE"
    )

    def for_role(self, role: str) -> dict[str, object]:
        """The effective model / endpoint / sampling / price settings of one role (a role registered by a
        method, with no section under ``judge.roles``, takes the judge's own settings)."""
        over: JudgeRoleConfig = getattr(self.roles, role, None) or JudgeRoleConfig()
        out: dict[str, object] = {}
        for name in JudgeRoleConfig.model_fields:
            v = getattr(over, name)
            out[name] = getattr(self, name) if v is None else v
        return out

    @model_validator(mode="after")
    def _budget_from_window(self) -> JudgeConfig:
        if self.max_judge_tokens is None and self.context_tokens is None:
            raise ValueError("judge.max_judge_tokens=null (trajectories shown whole, compacted only to fit the "
                             "judge's window) needs judge.context_tokens, the window the budget is derived from; "
                             "set judge.context_tokens or a cap judge.max_judge_tokens")
        return self

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return builtin_or_plugin(v, JUDGE_BACKENDS)
