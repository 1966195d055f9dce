"""Parquet schemas of every table a run writes (docs/interfaces.md "Table columns").

Parquet is the source of truth; these schemas are applied on every write so that the SQL names users rely on
stay stable. Non-nullable fields are the keys a row cannot be stored without.

This module declares the pipeline's tables (runs, steps, stages, rollouts and trajectories, judge calls, eval
results, and ARBOR's rubric lifecycle, which the report and ``sql/`` read). A method declares its own tables,
``steps`` columns and views in its package as a ``TableSet`` (``tasks/methods/arco/tables.py``),
registered here when its class is defined; the store then conforms and the catalog views them like the
pipeline's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

STR = pa.string()
I64 = pa.int64()
F64 = pa.float64()
BOOL = pa.bool_()
TS = pa.timestamp("us", tz="UTC")


def _f(name: str, typ: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


def _key(name: str, typ: pa.DataType = STR) -> pa.Field:
    return pa.field(name, typ, nullable=False)


col = _f  # a nullable column, for a method's TableSet
key = _key  # a key column (refused when missing or null)


STEP_METRICS = [
    "mean_base_reward", "mean_total_reward", "format_valid_rate", "zero_var_base", "zero_var_total",
    "mean_searches", "mean_response_tokens", "loss", "clip_frac", "approx_kl", "tis_mean", "tis_clip_frac",
    "entropy", "grad_norm", "judge_cost_usd",
]

SCHEMAS: dict[str, pa.Schema] = {
    "runs": pa.schema([
        _key("run_id"), _f("profile", STR), _f("method", STR), _f("seed", I64), _f("config_json", STR),
        _f("created_at", TS), _f("git_sha", STR),
        _f("config_changes", STR),  # JSON list of {at, key, old, new}: overrides applied on resume
        # the process that owns the run (its latest attempt; storage/heartbeat.py): host, pid and the pid's start
        # time (against pid reuse), a heartbeat rewritten while the flow runs, and when the flow ended
        _f("host", STR), _f("pid", I64), _f("pid_start", STR), _f("heartbeat_at", TS), _f("flow_ended_at", TS),
        # the question sets it trains and evaluates on (data.train, data.eval as a list)
        _f("train_set", STR), _f("eval_sets", pa.list_(STR)),
    ]),
    "steps": pa.schema(
        [_key("run_id"), _key("step", I64), _f("completed_at", TS), _f("wall_seconds", F64)]
        + [_f(m, F64) for m in STEP_METRICS]
        + [_f("n_groups", I64), _f("judge_calls", I64), _f("policy_version", I64), _f("dropped_groups", I64),
           # streamed judging: judge calls made ahead of their stage, those never claimed (a wrong
           # guess: not in judge_calls) and what they cost; null when the step's judging was not streamed
           _f("prefetched_calls", I64), _f("prefetch_wasted_calls", I64), _f("prefetch_wasted_cost_usd", F64),
           # judge health (llm/health.py): the step's calls that failed in transport and that were
           # refused (no answer in the reply), the rollout groups the judge answered about, and the roles whose
           # refused share passed judge.warn_refused_share (comma-separated; null: the step is not degraded)
           _f("judge_calls_failed", I64), _f("judge_calls_refused", I64), _f("judged_groups", I64),
           _f("judge_degraded", STR)]
    ),
    "stage_runs": pa.schema([
        _key("run_id"), _key("step", I64), _key("stage"), _f("started_at", TS), _f("finished_at", TS),
        _f("wall_seconds", F64), _f("status", STR),
    ]),
    "trajectories": pa.schema([
        _key("traj_id"), _key("run_id"), _key("step", I64), _key("group", I64), _key("sample", I64),
        _f("question_id", STR), _f("question", STR), _f("golds", pa.list_(STR)), _f("text", STR),
        _f("turns", I64), _f("search_calls", I64), _f("search_queries", pa.list_(STR)),
        _f("prompt_ids", pa.list_(pa.int32())), _f("response_ids", pa.list_(pa.int32())),
        _f("loss_mask", pa.list_(pa.int8())), _f("rollout_logprobs", pa.list_(pa.float32())),
        _f("finish_reason", STR), _f("format_valid", BOOL), _f("format_reason", STR), _f("answer", STR),
        _f("em", F64), _f("f1", F64), _f("base_reward", F64), _f("shaped_reward", F64),
        _f("policy_version", I64), _f("gen_seconds", F64), _f("prompt_tokens", I64), _f("response_tokens", I64),
        _f("stage_starts", pa.list_(pa.int32())), _f("stage_rewards", pa.list_(F64)),
    ]),
    "rubric_events": pa.schema([
        _key("run_id"), _key("step", I64), _f("seq", I64), _f("group", I64), _f("rubric_id", STR),
        _key("event"), _f("kind", STR), _f("title", STR), _f("description", STR),
        _f("counter_description", STR), _f("feature", STR), _f("direction", I64), _f("variance", F64),
        _f("pearson", F64), _f("n_r", I64), _f("rho_r", F64), _f("n_activations", I64),
        _f("mean_variance", F64), _f("pool_size", I64), _f("candidate_pool_size", I64),
        _f("other_rubric_id", STR), _f("similarity", F64), _f("reason", STR),
    ]),
    "rubric_activations": pa.schema([
        _key("run_id"), _key("step", I64), _key("group", I64), _key("rubric_id"), _f("variance", F64),
        _f("n_edges", I64), _f("n_failed_edges", I64), _f("kept", BOOL), _f("judge_error", BOOL),
        _f("scores", pa.list_(F64)), _f("n_r_after", I64), _f("rho_r_after", F64),
        _f("n_activations_after", I64), _f("mean_variance_after", F64),
    ]),
    "rubric_sources": pa.schema([
        _key("run_id"), _key("step", I64), _key("common_rubric_id"), _key("draft_rubric_id"),
        _f("draft_step", I64), _f("group", I64), _f("question_id", STR), _f("question", STR),
    ]),
    "judge_calls": pa.schema([
        _key("run_id"), _key("step", I64), _f("stage", STR), _f("role", STR), _f("backend", STR),
        _f("model", STR), _f("prompt_version", STR), _f("cache_key", STR), _f("prompt_hash", STR),
        _f("group", I64), _f("rubric_id", STR), _f("edge", STR), _f("latency_s", F64),
        _f("prompt_tokens", I64), _f("completion_tokens", I64), _f("cost_usd", F64), _f("cache_hit", BOOL),
        _f("attempts", I64), _f("error", STR),
        # what each attempt ended in, in order: null for the one that answered, else its error class
        # (InvalidOutput, InvalidAnswer, Truncated, RateLimitError, ...); [] for a cache hit;
        # InvalidAnswer: a reply that validated but echoed the prompt's template or looped,
        # written InvalidAnswer:<reason> with the filter's short reason (placeholder, echo, loop, ...)
        _f("attempt_errors", pa.list_(STR)),
        # why a call that ended refused was refused: the answer filter's short reason (hollow,
        # placeholder, echo, loop, ...), unparseable, truncated, or the rules heuristic's Refusal; else null
        _f("refusal", STR),
        # beside attempt_errors, the first 200 characters of each attempt's reply when it was refused (the model's
        # words, never a credential), else null: a weak judge told from a filter too strict
        _f("attempt_replies", pa.list_(STR)),
    ]),
    "eval_results": pa.schema([
        _key("run_id"), _key("step", I64), _f("checkpoint", STR), _f("split", STR), _key("question_id"),
        _f("run_index", I64), _f("answer", STR), _f("format_valid", BOOL), _f("em", F64), _f("f1", F64),
        _f("judge_correct", BOOL), _f("judge_model", STR), _f("guidance", STR),
    ]),
}

# The rollout stage's trajectories (base reward only), before shaping writes the final ``trajectories`` rows:
# a resumed step re-reads them instead of sampling again.
SCHEMAS["rollouts"] = SCHEMAS["trajectories"]
# Each induced draft's pairwise scores on its source group (admission, eq. 2; the no-memory baseline's shaping).
SCHEMAS["draft_scores"] = pa.schema([
    _key("run_id"), _key("step", I64), _key("group", I64), _key("rubric_id"), _f("title", STR),
    _f("description", STR), _f("counter_description", STR), _f("feature", STR), _f("direction", I64),
    _f("scores", pa.list_(F64)), _f("n_edges", I64), _f("n_failed_edges", I64),
])

PIPELINE_TABLES: tuple[str, ...] = tuple(SCHEMAS)  # the pipeline's own; a method declares its own (``TableSet``)
OWNER: dict[str, str] = dict.fromkeys(PIPELINE_TABLES, "pipeline")  # table (or "steps.<column>") -> who declared it


class SchemaError(ValueError):
    """A row batch does not fit its table's declared schema."""


@dataclass(frozen=True)
class TableSet:
    """What a method stores beyond the pipeline's tables: its tables and their schemas, the
    columns it adds to the ``steps`` row, and its SQL views (files ``<name>.sql``, each creating the view
    ``<name>``). Declared once, in the method's package (``Method.tables``), and registered when the method's
    class is defined (``register_tables``)."""

    owner: str
    schemas: Mapping[str, pa.Schema] = dc_field(default_factory=dict)
    step_columns: tuple[pa.Field, ...] = ()
    views: tuple[Path, ...] = ()


VIEWS: dict[str, Path] = {}  # view name -> its DDL file, from every registered TableSet


def register_tables(tables: TableSet) -> None:
    """Make ``tables`` known to the store: a table or ``steps`` column already declared by another owner must be
    declared identically (a method and its subclass share theirs); anything else is a ``SchemaError`` naming both."""
    for name, schema in tables.schemas.items():
        if name in SCHEMAS and OWNER[name] != tables.owner and not SCHEMAS[name].equals(schema):
            raise SchemaError(f"table {name!r}: {tables.owner} declares it differently from {OWNER[name]}")
    steps = {f.name: f for f in SCHEMAS["steps"]}
    for f in tables.step_columns:
        if f.name in steps and not steps[f.name].equals(f):
            raise SchemaError(f"steps column {f.name!r}: {tables.owner} declares it differently from "
                              f"{OWNER.get('steps.' + f.name, 'pipeline')}")
    for name, schema in tables.schemas.items():
        SCHEMAS.setdefault(name, schema)
        OWNER.setdefault(name, tables.owner)
    for f in tables.step_columns:
        if f.name not in steps:
            steps[f.name] = f
            OWNER["steps." + f.name] = tables.owner
    SCHEMAS["steps"] = pa.schema(list(steps.values()))
    for path in tables.views:
        VIEWS.setdefault(path.stem, path)


def tables() -> tuple[str, ...]:
    """Every table this process knows: the pipeline's, then those registered by the methods it imported."""
    return tuple(SCHEMAS)


def schema_for(table: str) -> pa.Schema:
    if table not in SCHEMAS:
        raise SchemaError(f"unknown table {table!r}; known tables: {', '.join(SCHEMAS)} (a method's own table is "
                          "known once its class is imported)")
    return SCHEMAS[table]


def schema_fingerprint() -> str:
    """Hash of every declared schema: a change re-creates the catalog views (storage.catalog)."""
    text = json.dumps({t: s.to_string(show_schema_metadata=False) for t, s in SCHEMAS.items()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _coerce(value: Any, typ: pa.DataType) -> Any:
    # A judge edge arrives as a pair (i, j); it is stored as the string "i-j".
    if pa.types.is_string(typ) and isinstance(value, tuple | list):
        return "-".join(str(v) for v in value)
    if pa.types.is_timestamp(typ) and isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)  # epoch seconds (time.time())
    if pa.types.is_string(typ) and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # an edge index in tasks.methods.arbor.judge.sparse_edges order
    return value


def conform(table: str, rows: list[dict[str, Any]] | pa.Table) -> pa.Table:
    """Apply ``table``'s schema to ``rows``: unknown columns are refused (naming them), missing nullable
    columns become null, missing or null keys are refused, types are cast (naming the column on failure)."""
    schema = schema_for(table)
    names = set(schema.names)
    if isinstance(rows, pa.Table):
        given = list(rows.column_names)
        n = rows.num_rows
    else:
        rows = list(rows)
        given = sorted({k for r in rows for k in r})
        n = len(rows)
    unknown = [c for c in given if c not in names]
    if unknown:
        raise SchemaError(f"table {table!r}: unknown column(s) {', '.join(unknown)} (declared in "
                          "storage/schemas.py or by its method's TableSet)")
    arrays = []
    for field in schema:
        if isinstance(rows, pa.Table):
            if field.name in given:
                stored = rows.column(field.name)
                try:
                    arr = stored.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                    raise SchemaError(f"table {table!r}, column {field.name!r}: cannot cast to {field.type}: {e}") from e
            else:
                arr = pa.nulls(n, field.type)
        else:
            values = [_coerce(r.get(field.name), field.type) for r in rows]
            try:
                arr = pa.array(values, type=field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                raise SchemaError(f"table {table!r}, column {field.name!r}: values do not fit {field.type}: {e}") from e
        if not field.nullable and arr.null_count:
            missing = "missing" if field.name not in given else f"null in {arr.null_count} row(s)"
            raise SchemaError(f"table {table!r}: required column {field.name!r} is {missing}")
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=schema)


def empty_table(table: str) -> pa.Table:
    return schema_for(table).empty_table()
