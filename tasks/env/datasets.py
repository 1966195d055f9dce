"""Question sets: one validated schema, converters for the shipped data, named splits, batching (§4.1, App. B.1).

Named specs for ``load_questions``:

- ``offline:train`` / ``offline:eval`` / ``offline:all`` / ``offline:heldout``: the 200 offline HotpotQA-distractor and
  MuSiQue dev questions whose paragraphs form the local corpus. ``heldout`` = the 39 that also occur in the ARPO
  benchmark test splits (30 HotpotQA, 9 MuSiQue); they are in ``eval`` and never in ``train``. ``eval`` adds a seeded
  20% of the remaining questions of each source; ``train`` is the rest (see docs/decisions/format-checker-base-reward-search-and-datasets.md).
- ``arpo:train`` (the ARPO QA pool minus the 5 questions that leak into the HotpotQA test split) and ``arpo:train2k``
  (a seeded 2,000-question sample of it, as the paper samples 2K QA examples).
- ``bench:hotpotqa``, ``bench:2wiki``, ``bench:musique``, ``bench:bamboogle`` (the ARPO test splits) and
  ``bench:local`` (= ``offline:heldout``: the benchmark questions answerable from the local corpus).
- ``<prefix>:<name>`` of a registered source (``tasks.env.sources``: an ``arbor.sources`` entry point or
  ``register_source``): the source's questions, given the run's config (``config=cfg``).
- ``hf:<owner>/<name>[@<revision>]/<file>`` or ``hf:<owner>/<name>[@<revision>][/<folder>]:<split>``: a question
  set on the Hugging Face Hub (``tasks.env.hub``), downloaded into the Hugging Face cache unless the environment
  keeps the Hub offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``), then read like a local file.
- anything else is a path: a JSONL or Parquet file, or a Hugging Face ``save_to_disk`` folder.

A row's fields, unless ``data.question_field`` / ``data.answer_field`` / ``data.id_field`` name them (paths with
dots and ``[i]``, e.g. ``extra_info.question``, ``prompt[-1].content``):

- question: ``question``, else ``extra_info.question``, else the last user message of a chat-list ``prompt``
  (verl's ``prompt`` column, as written, so with any instruction text around the question). verl's Search-R1
  preprocessing keeps the bare question in ``extra_info.question``, which is why it comes first: arbor's protocol
  writes its own instructions around the question. A field that holds a chat list (or one message) gives the
  last user message's content the same way (``data.question_field=prompt``, verl's ``data.prompt_key``).
- answers: exactly one of ``answer | answers | golden_answers`` (Search-R1 / FlashRAG), else verl's
  ``reward_model.ground_truth``; a string, a list of strings, or a mapping with a ``target`` (list or string).
  With ``data.require_answers=false`` a row with none is a question without golds (DR Tulu's research queries:
  ``messages`` holds the query, ``ground_truth`` its rubrics, no answer key; EM / F1 score 0 on them).

``data.eval`` may list several sets (``DataConfig.eval_sets()``): each is loaded and reported on its own.
- id: ``question_id``, else ``id``, else verl's ``extra_info.index``; else ``<file stem>-<line or row>``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbor.config import ArborConfig
from arbor.config.data import DataConfig
from arbor.jsonl import jsonl_rows
from arbor.paths import DATA_DIR, PROJECT_ROOT
from arbor.reward import normalize_answer
from arbor.seeding import derive_seed
from arbor.tasks.env.hub import HUB_PREFIX, HubError, dataset_files
from arbor.tasks.env.sources import known_sources, spec_source

BENCHMARKS = ("hotpotqa", "2wiki", "musique", "bamboogle")
OFFLINE_FILES = {
    "hotpotqa": "offline/hotpotqa_dev100_distractor.json",
    "musique": "offline/musique_dev100.json",
    "2wiki": "offline/2wiki_corpus.json",  # passages only, no questions
}
ARPO_POOL = "train/arpo_qa_5k.jsonl"
ARPO_SAMPLE_SIZE, ARPO_SAMPLE_SEED = 2000, 0
OFFLINE_EVAL_FRACTION, OFFLINE_SPLIT_SEED = 0.2, 0
CORPUS_FILE = DATA_DIR / "corpus" / "wiki_passages.jsonl"


class DatasetError(ValueError):
    """A bad question file or row; the message names the file and line (or row)."""


@dataclass(frozen=True)
class Question:
    """One training / evaluation question. ``golds`` are the gold answer aliases (best-of for EM / F1).

    ``support`` / ``support_titles``: the gold supporting paragraphs (corpus doc ids / titles), offline sets only.
    """

    question_id: str
    question: str
    golds: list[str]
    source: str = ""
    support: list[str] = field(default_factory=list)
    support_titles: list[str] = field(default_factory=list)
    # what the prompt shows before the question (RubricEM's retrieved bank items, App. D.6.3); the trajectory's
    # ``question`` stays the original text
    reference: str = ""


# ----------------------------------------------------------------------------------------------- generic loader


QUESTION_FIELDS = ("question", "extra_info.question", "prompt")  # arbor's, verl's (Search-R1's script), verl's chat
ANSWER_FIELDS = ("answer", "answers", "golden_answers")  # arbor's, and Search-R1 / FlashRAG's
VERL_ANSWER = "reward_model.ground_truth"  # verl's, when none of ANSWER_FIELDS is there
ID_FIELDS = ("question_id", "id", "extra_info.index")
_MISSING = object()
_PART = re.compile(r"([^.\[\]]*)((?:\[-?\d+\])*)")


@dataclass(frozen=True)
class Fields:
    """Where a row keeps its question, answers and id (``data.question_field`` / ``answer_field`` / ``id_field``).

    Paths take dots and ``[i]`` (``reward_model.ground_truth``, ``prompt[-1].content``, ``prompt.0.content``).
    ``None`` looks in the usual places (module docstring): ``QUESTION_FIELDS``, exactly one of ``ANSWER_FIELDS``
    else ``VERL_ANSWER``, ``ID_FIELDS``. An answer may be a string, a list of strings, or a mapping with a
    ``target`` (Search-R1's verl data: ``ground_truth = {"target": [...]}``); a question may be a chat list or one
    message (its last user message's content)."""

    question: str | None = None
    answer: str | None = None
    id: str | None = None
    answer_required: bool = True  # False (data.require_answers): a row with no answer field has no golds


def field_path(path: str) -> list[str | int]:
    """The steps of a field path: keys, and list positions written ``[i]`` (``DatasetError`` for a malformed one)."""
    steps: list[str | int] = []
    for piece in path.split("."):
        m = _PART.fullmatch(piece)
        if m is None or (not m[1] and not m[2]):
            raise DatasetError(f"malformed field path {path!r} (keys joined by '.', list positions as [i])")
        if m[1]:
            steps.append(m[1])
        steps += [int(i) for i in re.findall(r"-?\d+", m[2])]
    return steps


def field_value(row: dict[str, Any], path: str) -> Any:
    """``row["a"]["b"][0]`` for ``"a.b[0]"`` (or ``"a.b.0"``), or ``_MISSING``."""
    node: Any = row
    for step in field_path(path):
        if isinstance(node, dict) and isinstance(step, str) and step in node:
            node = node[step]
        elif isinstance(node, list) and (isinstance(step, int) or step.lstrip("-").isdigit()):
            i = int(step)
            if not -len(node) <= i < len(node):
                return _MISSING
            node = node[i]
        else:
            return _MISSING
    return node


def _is_message(x: Any) -> bool:
    return isinstance(x, dict) and "role" in x and "content" in x


def _chat_question(value: Any, name: str, where: str) -> Any:
    """The question in ``value``: itself, or the last user message's content of a chat list / one message."""
    if _is_message(value):
        value = [value]
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        users = [m for m in value if m["role"] == "user"]
        if not users:
            raise DatasetError(f"{where}: field '{name}' is a chat list with no user message "
                               f"(roles: {', '.join(str(m['role']) for m in value)})")
        content = users[-1]["content"]
        if not isinstance(content, str) or not content.strip():
            raise DatasetError(f"{where}: field '{name}': the last user message's content must be a non-empty "
                               "string")
        return content
    return value


def _question(row: dict[str, Any], where: str, fields: Fields) -> str:
    if fields.question is not None:
        name, q = fields.question, field_value(row, fields.question)
    else:
        name, q = next(((k, v) for k in QUESTION_FIELDS if (v := field_value(row, k)) is not _MISSING
                        and v is not None), (QUESTION_FIELDS[0], _MISSING))
    q = _chat_question(q, name, where)
    if not isinstance(q, str) or not q.strip():
        why = ""
        if q is _MISSING:
            why = (" (missing; set data.question_field)" if fields.question is not None else
                   f" (missing, and no {' or '.join(repr(k) for k in QUESTION_FIELDS[1:])} chat list either; "
                   "set data.question_field)")
        raise DatasetError(f"{where}: field '{name}' must be a non-empty string{why}")
    return q


def _row_to_question(row: Any, where: str, default_id: str, fields: Fields = Fields()) -> Question:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object with a question and an answer field, got "
                           f"{type(row).__name__}")
    q = _question(row, where, fields)
    golds = _golds(row, where, fields)
    qid = _question_id(row, default_id, where, fields)
    for text in (q, *golds, qid):
        try:  # JSON can spell a lone surrogate (\\ud800), which no tokenizer or Parquet file takes
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DatasetError(f"{where}: {text[max(0, e.start - 20):e.start]!r}... holds a lone surrogate "
                               f"(\\u{ord(text[e.start]):04x}), which is not text") from e
    return Question(qid, q.strip(), [g.strip() for g in golds])


def _golds(row: dict[str, Any], where: str, fields: Fields) -> list[str]:
    """A row's gold answers (``Fields``); [] for a row with none when answers are not required."""
    if fields.answer is not None:
        name, raw = fields.answer, field_value(row, fields.answer)
        if raw is _MISSING:
            raise DatasetError(f"{where}: field '{name}' (data.answer_field) is missing")
    else:
        present = [k for k in ANSWER_FIELDS if row.get(k) is not None]
        if not present and not fields.answer_required and field_value(row, VERL_ANSWER) in (_MISSING, None):
            return []
        if len(present) > 1 or (not present and field_value(row, VERL_ANSWER) in (_MISSING, None)):
            raise DatasetError(f"{where}: exactly one of {', '.join(repr(k) for k in ANSWER_FIELDS)} is required "
                               f"(found {len(present) or 'none'}{'' if present else f', nor {VERL_ANSWER!r}'}; "
                               "or name one with data.answer_field)")
        name = present[0] if present else VERL_ANSWER
        raw = field_value(row, name)
    if isinstance(raw, dict) and "target" in raw:
        raw = raw["target"]
    golds = [raw] if isinstance(raw, str) else raw
    if not isinstance(golds, list) or not golds or not all(isinstance(g, str) and g.strip() for g in golds):
        raise DatasetError(f"{where}: field '{name}' must be a non-empty string or a non-empty list of them")
    return golds


def _question_id(row: dict[str, Any], default_id: str, where: str, fields: Fields) -> str:
    ids = [fields.id] if fields.id is not None else list(ID_FIELDS)
    qid = next((v for k in ids if (v := field_value(row, k)) is not _MISSING and v is not None), default_id)
    if not isinstance(qid, (str, int)) or isinstance(qid, bool):
        raise DatasetError(f"{where}: field '{'/'.join(ids)}' (the id) must be a string or integer")
    return str(qid)


def _hf_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a Hugging Face ``datasets`` folder written by ``save_to_disk`` (Arrow stream files listed in
    ``state.json``), read with pyarrow: no ``datasets`` import, no hub."""
    import pyarrow as pa

    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise DatasetError(f"{path}: a DatasetDict with splits {splits}; point data.train / data.eval at one of "
                           f"them, e.g. {path / (splits[0] if splits else 'train')}")
    state = path / "state.json"
    if not state.exists():
        raise DatasetError(f"{path}: a folder, but not a Hugging Face save_to_disk dataset (no state.json)")
    try:
        files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        tables = [pa.ipc.open_stream(pa.memory_map(str(f))).read_all() for f in files]
    except (OSError, KeyError, ValueError, pa.ArrowInvalid) as e:
        raise DatasetError(f"{path}: not a readable save_to_disk dataset: {e}") from e
    return [r for t in tables for r in t.to_pylist()]


def read_questions(path: str | Path, id_prefix: str | None = None, fields: Fields = Fields()) -> list[Question]:
    """Load question rows from JSONL, Parquet or a Hugging Face ``save_to_disk`` folder, validated.

    Fields as in ``Fields`` (default: ``question``, ``answer | answers | golden_answers``, ``question_id | id``).
    A bad row raises ``DatasetError("<file>:<line>: ...")`` naming the field (Parquet and Arrow: ``<file>: row
    <n>``). Ids default to ``<id_prefix or file stem>-<line number>``; duplicate ids are refused.
    """
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"question file not found: {path}")
    prefix = id_prefix or path.stem
    out: list[Question] = []
    if path.is_dir() or path.suffix == ".parquet":
        if path.is_dir():
            rows = _hf_rows(path)
        else:
            import pyarrow.parquet as pq

            try:
                rows = pq.read_table(path).to_pylist()
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
                raise DatasetError(f"{path}: not a readable Parquet file: {e}") from e
        for i, row in enumerate(rows, 1):
            out.append(_row_to_question(row, f"{path}: row {i}", f"{prefix}-{i}", fields))
    else:
        for i, row in jsonl_rows(path, DatasetError):
            out.append(_row_to_question(row, f"{path}:{i}", f"{prefix}-{i}", fields))
    if not out:
        raise DatasetError(f"{path}: holds no questions")
    _unique_ids(out, str(path), fields)
    return out


def _unique_ids(questions: list[Question], where: str, fields: Fields) -> None:
    """Refuse a duplicate question id, naming both records and where the ids came from."""
    seen: dict[str, int] = {}
    for n, q in enumerate(questions, 1):
        if q.question_id in seen:
            source = f"data.id_field={fields.id}" if fields.id else f"the first of {', '.join(ID_FIELDS)} a row has"
            raise DatasetError(f"{where}: duplicate question id {q.question_id!r} (records {seen[q.question_id]} and "
                               f"{n}; ids from {source}: set data.id_field to a unique field)")
        seen[q.question_id] = n


def hub_questions(spec: str, fields: Fields = Fields()) -> list[Question]:
    """A question set on the Hugging Face Hub (``hf:...``, ``tasks.env.hub``): its files, read as local files
    (ids default to ``<file stem>-<row>``), in order; duplicate ids across files are refused."""
    try:
        files = dataset_files(spec)
    except HubError as e:
        raise DatasetError(f"question set {e}") from e
    out = [q for f in files for q in read_questions(f, fields=fields)]
    _unique_ids(out, f"question set {spec!r} ({len(files)} file{'s' * (len(files) > 1)})", fields)
    return out


# ----------------------------------------------------------------------------------------------- shipped formats


def passage_id(title: str, text: str) -> str:
    """Stable corpus id of a passage: a hash of its title and whitespace-normalised text."""
    return "w" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


def _norm_text(s: str) -> str:
    return " ".join(s.split())


def _load_json(rel: str) -> Any:
    with open(DATA_DIR / rel, encoding="utf-8") as f:
        return json.load(f)


@functools.lru_cache(maxsize=1)
def _offline() -> tuple[tuple[Question, ...], tuple[dict, ...]]:
    """Offline questions (with gold paragraph ids) and the deduplicated passages, in a fixed order."""
    passages: dict[str, dict] = {}

    def add(title: str, text: str, source: str) -> str:
        title, text = title.strip(), _norm_text(text)
        pid = passage_id(title, text)
        passages.setdefault(pid, {"id": pid, "title": title, "text": text, "source": source})
        return pid

    questions: list[Question] = []
    for i, ex in enumerate(_load_json(OFFLINE_FILES["hotpotqa"])):
        ctx = ex["context"]
        ids = [add(t, "".join(s), "hotpotqa") for t, s in zip(ctx["title"], ctx["sentences"], strict=True)]
        gold_titles = list(dict.fromkeys(ex["supporting_facts"]["title"]))
        support = [pid for t, pid in zip(ctx["title"], ids, strict=True) if t in gold_titles]
        questions.append(Question(f"hotpotqa-dev-{i:03d}", ex["question"].strip(), [ex["answer"].strip()],
                                  "hotpotqa", list(dict.fromkeys(support)), gold_titles))
    for ex in _load_json(OFFLINE_FILES["musique"]):
        support, titles = [], []
        for p in ex["paragraphs"]:
            pid = add(p["title"], p["paragraph_text"], "musique")
            if p["is_supporting"]:
                support.append(pid)
                titles.append(p["title"].strip())
        golds = list(dict.fromkeys([ex["answer"].strip(), *(a.strip() for a in ex["answer_aliases"])]))
        questions.append(Question(f"musique-{ex['id']}", ex["question"].strip(), golds, "musique",
                                  list(dict.fromkeys(support)), titles))
    for p in _load_json(OFFLINE_FILES["2wiki"]):
        add(p["title"], p["text"], "2wiki")
    return tuple(questions), tuple(passages.values())


def corpus_rows() -> list[dict]:
    """The deduplicated Wikipedia passages of the offline files: ``{id, title, text, source}`` rows."""
    return [dict(p) for p in _offline()[1]]


def build_corpus(path: str | Path = CORPUS_FILE) -> Path:
    """Write the default BM25 corpus (JSONL, one passage per line, stable ids) atomically; returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in corpus_rows():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def offline_questions() -> list[Question]:
    """All 200 offline questions (100 HotpotQA dev-distractor, 100 MuSiQue dev) with gold paragraph ids."""
    return list(_offline()[0])


@functools.cache
def _benchmark(name: str) -> tuple[Question, ...]:
    if name not in BENCHMARKS:
        raise DatasetError(f"unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
    qs = read_questions(DATA_DIR / "benchmarks" / name / "test.jsonl", id_prefix=f"{name}-test")
    return tuple(Question(f"{name}-test-{i:03d}", q.question, q.golds, name) for i, q in enumerate(qs))


def benchmark_questions(name: str) -> list[Question]:
    """An ARPO benchmark test split (200 HotpotQA / 2Wiki / MuSiQue, 125 Bamboogle)."""
    return list(_benchmark(name))


def _benchmark_keys() -> set[str]:
    return {normalize_answer(q.question) for b in BENCHMARKS for q in _benchmark(b)}


@functools.lru_cache(maxsize=1)
def _arpo_pool() -> tuple[tuple[Question, ...], tuple[Question, ...]]:
    """(kept, dropped): the ARPO QA pool without the questions whose normalised text is in a benchmark test split."""
    path = DATA_DIR / ARPO_POOL
    rows = read_questions(path)
    with open(path, encoding="utf-8") as f:
        index = [json.loads(line)["index"] for line in f if line.strip()]
    keys = _benchmark_keys()
    kept, dropped = [], []
    for q, idx in zip(rows, index, strict=True):
        q = Question(f"arpo-{idx}", q.question, q.golds, "arpo")
        (dropped if normalize_answer(q.question) in keys else kept).append(q)
    return tuple(kept), tuple(dropped)


def arpo_leaked() -> list[Question]:
    """The ARPO pool questions dropped because they occur in a benchmark test split (5, all HotpotQA)."""
    return list(_arpo_pool()[1])


@functools.lru_cache(maxsize=1)
def _offline_split() -> dict[str, tuple[Question, ...]]:
    keys = _benchmark_keys()
    heldout, train, eval_ = [], [], []
    for source in ("hotpotqa", "musique"):
        qs = [q for q in _offline()[0] if q.source == source]
        held = [q for q in qs if normalize_answer(q.question) in keys]
        rest = [q for q in qs if normalize_answer(q.question) not in keys]
        n_eval = round(OFFLINE_EVAL_FRACTION * len(rest))
        picked = set(random.Random(derive_seed(OFFLINE_SPLIT_SEED, "offline-split", source)).sample(
            [q.question_id for q in rest], n_eval))
        heldout += held
        eval_ += held + [q for q in rest if q.question_id in picked]
        train += [q for q in rest if q.question_id not in picked]
    return {"train": tuple(train), "eval": tuple(eval_), "heldout": tuple(heldout), "all": _offline()[0]}


# ----------------------------------------------------------------------------------------------- named specs


SHIPPED_KINDS = ("offline", "arpo", "bench")  # named splits of the shipped data; hf: the Hub; any other prefix is a source's
EVAL_SPLITS = {"bamboogle": "bench:bamboogle", "hotpotqa": "bench:hotpotqa", "musique": "bench:musique",
               "2wiki": "bench:2wiki"}  # `arbor eval --split NAME`: the paper's benchmark names


def split_spec(name: str) -> str:
    """The dataset spec of an ``arbor eval --split`` value: a benchmark name, else the value as a spec or path."""
    return EVAL_SPLITS.get(name, name)


def load_questions(spec: str, *, size: int | None = None, seed: int = 0, config: ArborConfig | None = None,
                   fields: Fields = Fields()) -> list[Question]:
    """Resolve a named split (module docstring) or a file path; ``size``: a seeded sample of that many.

    ``config``: the run's config, handed to a registered source (default: the defaults); ``fields``: where a user's
    file keeps its question, answers and id (``fields_of(cfg.data)``)."""
    found = None if spec.partition(":")[0] in (*SHIPPED_KINDS, HUB_PREFIX) else spec_source(spec)
    if found is None:
        qs = _shipped_or_file(spec, fields)
    elif found[0].questions is None:
        raise DatasetError(f"question set {spec!r}: the source {spec.partition(':')[0]!r} serves no questions")
    else:
        try:
            qs = found[0].questions(found[1], config or ArborConfig())
        except DatasetError:
            raise
        except ValueError as e:  # a source's own error, its message kept (it names the config key)
            raise DatasetError(str(e)) from e
    return sample_questions(qs, size, seed) if size is not None else qs


def _shipped_or_file(spec: str, fields: Fields) -> list[Question]:
    """A shipped named split (``SHIPPED_KINDS``), a Hub question set (``hf:...``), else a file or folder."""
    kind, _, name = spec.partition(":")
    if kind == "offline" and name:
        split = _offline_split()
        if name not in split:
            raise DatasetError(f"unknown split {spec!r} (known: {', '.join('offline:' + k for k in split)})")
        qs = list(split[name])
    elif kind == "arpo" and name:
        pool = list(_arpo_pool()[0])
        if name == "train":
            qs = pool
        elif name == "train2k":
            qs = sample_questions(pool, ARPO_SAMPLE_SIZE, ARPO_SAMPLE_SEED)
        else:
            raise DatasetError(f"unknown split {spec!r} (known: arpo:train, arpo:train2k)")
    elif kind == "bench" and name:
        qs = list(_offline_split()["heldout"]) if name == "local" else benchmark_questions(name)
    elif kind == HUB_PREFIX and name:
        qs = hub_questions(spec, fields)
    else:
        path = Path(spec)
        if not path.is_absolute() and not path.exists():
            path = PROJECT_ROOT / path
        if not path.exists():
            raise DatasetError(f"question set {spec!r} is neither a named split (offline:train, offline:eval, "
                               f"arpo:train2k, bench:hotpotqa, ...), nor a registered source's set (known sources: "
                               f"{known_sources()}), nor a Hub dataset (hf:<owner>/<name>/<file>), nor an existing "
                               "file or folder")
        qs = read_questions(path, fields=fields)
    return qs


def fields_of(data: DataConfig) -> Fields:
    """The ``data`` section's field mapping."""
    return Fields(data.question_field, data.answer_field, data.id_field, data.require_answers)


def sample_questions(questions: Sequence[Question], n: int, seed: int) -> list[Question]:
    """A seeded sample of ``n`` questions, kept in their original order (all of them if n >= len)."""
    if n >= len(questions):
        return list(questions)
    picked = set(random.Random(derive_seed(seed, "sample", len(questions), n)).sample(range(len(questions)), n))
    return [q for i, q in enumerate(questions) if i in picked]


def batch_for_step(questions: Sequence[Question], seed: int, step: int, batch_size: int) -> list[Question]:
    """The batch of step ``step``: positions [step*B, (step+1)*B) of a stream of epoch-wise seeded permutations.

    Epoch e is a permutation seeded by (seed, "batch", e), so every question is used once before any repeats, and a
    resumed run gets the same batches.
    """
    n = len(questions)
    if n == 0 or batch_size < 1 or step < 0:
        raise ValueError("batch_for_step needs questions, batch_size >= 1 and step >= 0")
    out: list[Question] = []
    perms: dict[int, list[int]] = {}
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(pos, n)
        if epoch not in perms:
            perm = list(range(n))
            random.Random(derive_seed(seed, "batch", epoch)).shuffle(perm)
            perms[epoch] = perm
        out.append(questions[perms[epoch][i]])
    return out


def resample_questions(questions: Sequence[Question], seed: int, step: int, round_: int, n: int,
                       exclude: set[str]) -> list[Question]:
    """DAPO dynamic sampling's extra prompts for round ``round_`` of step ``step``: ``n`` questions drawn without
    replacement by a generator seeded with (seed, step, "dapo-resample", round), from those whose id is not in
    ``exclude`` (the step's batch and earlier rounds); when too few are left, the whole pool is drawn from again."""
    pool = [q for q in questions if q.question_id not in exclude] or list(questions)
    rng = random.Random(derive_seed(seed, step, "dapo-resample", round_))
    out: list[Question] = []
    while len(out) < n:
        out += rng.sample(pool, min(n - len(out), len(pool)))
    return out
