"""Evaluation maths: pass@1 of EM, token F1 and LLM-judge accuracy, strict-format and valid-only (paper §4.1, App. C).

Protocol (paper §4.1 "Evaluation Metrics", App. C.1, C.2):

- **pass@1 averaged over n runs**: each question is answered once per evaluation run r = 1..n (default 5); a
  metric's pass@1 for run r is its mean over the questions of the split, and the reported figure is the mean of the
  n per-run values:  pass@1 = (1/n) * sum_r (1/|Q_r|) * sum_{q in Q_r} m(q, r).
- **Strict format gate (official)**: "a response is scored only if it produces a non-empty prediction and
  terminates with the required final-answer format ... all official metrics are set to zero, including EM, F1, and
  LLM-judge accuracy" (C.1). Stored rows are gated: an invalid response has em = f1 = 0 and judge_correct = False
  (it is never sent to the judge).
- **Valid-only** (Table 5): the same metrics averaged over the format-valid responses only.
- **Valid rate** = format-valid responses / responses; **recovery** = valid-only accuracy - official accuracy
  ("the gap between the two LLM accuracies", C.1).
- **Avg.** (Table 1 / Table 7): the unweighted mean of the per-benchmark figures.
- **Second judge** (Table 6, C.2): the same answers re-judged by an independent model; stored as extra rows that
  differ only in ``judge_model``; delta = second - main, gain over a baseline method per judge.

A judge call that fails (``JudgeOutcome.value is None``) is stored as ``judge_correct = None`` and counts as
incorrect in both official and valid-only accuracy; the count is reported (``n_judge_failed``) so a table with
failures is never mistaken for a clean one (docs/decisions/evaluation-reports-and-tracking.md).
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from arbor.format import check_format, get_protocol
from arbor.reward import exact_match, token_f1
from arbor.seeding import derive_seed
from arbor.tasks.reporting.accuracy import ACCURACY

# Paper benchmark names (Table 1 header) for the shipped split names.
SPLIT_TITLES = {"bamboogle": "Bamboogle", "hotpotqa": "HotpotQA", "musique": "MuSiQue", "2wiki": "2Wiki"}


class EvalError(ValueError):
    """Evaluation rows that cannot be aggregated (missing column, mixed judges without a choice, ...)."""


# ---- scoring one response ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    """One evaluated response: question ``question_id`` of ``split`` answered in evaluation run ``run_index``."""

    split: str
    question_id: str
    run_index: int
    question: str
    golds: tuple[str, ...]
    text: str
    truncated: bool = False
    protocol: str = "arbor"  # the tag protocol the response was written in (rollout.protocol)


TRUNCATED_REASONS = ("length", "max_turns")  # tasks.env.agent: a spent token or turn budget is a truncation


def prediction_from_trajectory(traj: Any, split: str, run_index: int, protocol: str = "arbor") -> Prediction:
    """A ``Prediction`` from a ``arbor.types.Trajectory`` the rollout engine produced for an evaluation question."""
    return Prediction(split, traj.question_id, run_index, traj.question, tuple(traj.golds), traj.text,
                      traj.finish_reason in TRUNCATED_REASONS, protocol)


def score_prediction(text: str, golds: str | Sequence[str], truncated: bool = False,
                     protocol: str = "arbor") -> dict[str, Any]:
    """Strict-gated answer, format validity, EM and F1 of one response (C.1: invalid -> all metrics 0)."""
    fmt = check_format(text, truncated, get_protocol(protocol))
    if not fmt.valid:
        return {"answer": fmt.answer, "format_valid": False, "em": 0.0, "f1": 0.0}
    return {"answer": fmt.answer, "format_valid": True, "em": exact_match(fmt.answer, golds),
            "f1": token_f1(fmt.answer, golds)}


def eval_rows(
    predictions: Iterable[Prediction],
    *,
    run_id: str,
    step: int,
    checkpoint: str | None,
    verdicts: Sequence[bool | None] | None = None,
    judge_model: str | None = None,
    guidance: str | None = None,
) -> list[dict[str, Any]]:
    """``eval_results`` rows for ``predictions`` (one row each). ``verdicts[i]`` is the judge's answer for
    prediction i (None: not judged or failed); invalid responses get ``judge_correct = False`` (strict gate).
    ``guidance`` tags answers written under Co-ReAct guidance (None: unguided)."""
    preds = list(predictions)
    if verdicts is not None and len(verdicts) != len(preds):
        raise EvalError(f"{len(verdicts)} verdicts for {len(preds)} predictions")
    rows = []
    for i, p in enumerate(preds):
        s = score_prediction(p.text, p.golds, p.truncated, p.protocol)
        verdict = verdicts[i] if verdicts is not None else None
        rows.append({
            "run_id": run_id, "step": step, "checkpoint": checkpoint, "split": p.split,
            "question_id": p.question_id, "run_index": p.run_index, **s,
            "judge_correct": (verdict if s["format_valid"] else False) if verdicts is not None else None,
            "judge_model": judge_model if verdicts is not None else None, "guidance": guidance,
        })
    return rows


# ---- the accuracy judge (App. E.4) -------------------------------------------------------------------------------

class _AccuracyJudge(Protocol):
    backend: str

    async def accuracy(self, question: str, golds: Sequence[str], prediction: str | None, *,
                       ctx: Any = None) -> Any: ...


def judge_model_name(judge: Any) -> str:
    """The name stored in ``judge_model``: the accuracy role's model (``rules`` for the offline backend)."""
    if getattr(judge, "backend", "") == "rules":
        return "rules"
    cfg = getattr(judge, "cfg", None)
    if cfg is not None and hasattr(cfg, "for_role"):
        return str(cfg.for_role("accuracy")["model"])
    return str(getattr(judge, "backend", "judge"))


async def judge_predictions(
    judge: _AccuracyJudge,
    predictions: Sequence[Prediction],
    *,
    run_id: str,
    step: int,
    checkpoint: str | None,
    judge_model: str | None = None,
    concurrency: int = 32,
    stage: str = "eval",
    guidance: str | None = None,
) -> list[dict[str, Any]]:
    """Score ``predictions`` and run the LLM accuracy judge (E.4) on every format-valid one; ``eval_results`` rows.

    Invalid responses are never sent (their official accuracy is 0 by the strict gate). At most ``concurrency``
    calls are in flight. Each call carries a ``CallContext(run_id, step, stage)`` for the judge ledger.
    """
    from arbor.llm.base import CallContext

    if concurrency < 1:
        raise EvalError(f"concurrency must be >= 1, got {concurrency}")
    model = judge_model or judge_model_name(judge)
    scored = [score_prediction(p.text, p.golds, p.truncated, p.protocol) for p in predictions]
    sem = asyncio.Semaphore(concurrency)
    ctx = CallContext(run_id=run_id, step=step, stage=stage)

    async def one(p: Prediction, s: dict[str, Any]) -> bool | None:
        if not s["format_valid"]:
            return False
        async with sem:
            out = await judge.ask(ACCURACY, question=p.question, golds=list(p.golds), prediction=s["answer"], ctx=ctx)
        return None if out.value is None else bool(out.value)

    verdicts = await asyncio.gather(*(one(p, s) for p, s in zip(predictions, scored, strict=True)))
    return eval_rows(predictions, run_id=run_id, step=step, checkpoint=checkpoint, verdicts=verdicts,
                     judge_model=model, guidance=guidance)


SECOND_JUDGE_STAGE = "eval-second"  # the stage (eval_results, judge_calls) of the second judge's verdicts (C.2)


def second_judge_config(judge_cfg: Any, model: str) -> Any:
    """C.2: the main judge's ``JudgeConfig`` with the accuracy role's model swapped for ``model``.

    The endpoint, key, sampling and prompt are the main accuracy judge's; only the model name changes. The rules
    (offline) backend has no model to swap and is refused, as is the main judge's own model (its rows could not be
    told apart in ``eval_results``)."""
    if judge_cfg.backend in ("rules", "world", "random"):  # world / random answer accuracy as rules does
        raise EvalError(f"eval.second_judge_model={model!r} needs an LLM judge (judge.backend=openai); "
                        f"the rules (offline) judge has no model to swap")
    main = str(judge_cfg.for_role("accuracy")["model"])
    if model == main:
        raise EvalError(f"eval.second_judge_model={model!r} is the main judge's own model; name another model")
    accuracy = judge_cfg.roles.accuracy.model_copy(update={"model": model})
    return judge_cfg.model_copy(update={"roles": judge_cfg.roles.model_copy(update={"accuracy": accuracy})})


# ---- aggregation -------------------------------------------------------------------------------------------------

def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def pass_at_1(rows: Iterable[Mapping[str, Any]], metric: str, *, valid_only: bool = False) -> float | None:
    """pass@1 averaged over evaluation runs: mean over ``run_index`` of the per-run mean of ``metric``.

    ``metric`` is ``em``, ``f1``, ``judge_correct`` (True = 1, False / None = 0) or ``format_valid``.
    ``valid_only`` restricts every run to its format-valid rows; a run without any is left out of the mean.
    None when no run has a row.
    """
    by_run: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if valid_only and not r["format_valid"]:
            continue
        v = r[metric]
        by_run[int(r["run_index"])].append(1.0 if v is True else 0.0 if v in (None, False) else float(v))
    return _mean([sum(v) / len(v) for _, v in sorted(by_run.items())])


@dataclass(frozen=True)
class SplitMetrics:
    """Fractions in [0, 1] (the printers show percentages). ``acc`` is official (strict-gated) LLM-judge accuracy."""

    split: str
    n_questions: int
    n_runs: int
    em: float | None
    f1: float | None
    acc: float | None
    valid_rate: float | None
    valid_em: float | None
    valid_f1: float | None
    valid_acc: float | None
    n_judge_failed: int = 0
    acc_second: float | None = None  # official accuracy under the second judge (Table 6)

    @property
    def recovery(self) -> float | None:
        """C.1: valid-only LLM accuracy minus official LLM accuracy."""
        return None if self.valid_acc is None or self.acc is None else self.valid_acc - self.acc


@dataclass(frozen=True)
class EvalSummary:
    """One evaluated checkpoint: per-split metrics and their unweighted average over splits (Table 1 "Avg.")."""

    splits: dict[str, SplitMetrics]
    average: SplitMetrics
    judge_model: str | None = None
    second_judge_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _judge_models(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({r["judge_model"] for r in rows if r.get("judge_model") is not None})


def split_metrics(rows: Sequence[Mapping[str, Any]], split: str, *, judge_model: str | None = None,
                  second_judge_model: str | None = None) -> SplitMetrics:
    """Metrics of one split. Rows of several judges carry the same answers: EM / F1 / validity are read from the
    ``judge_model`` rows; accuracy from them, the second judge's accuracy from the ``second_judge_model`` rows."""
    if judge_model is not None:
        main = [r for r in rows if r.get("judge_model") == judge_model]
    else:
        main = [r for r in rows if second_judge_model is None or r.get("judge_model") != second_judge_model]
    has_judge = any(r.get("judge_model") is not None for r in main)
    second = [r for r in rows if r.get("judge_model") == second_judge_model] if second_judge_model else []
    return SplitMetrics(
        split=split,
        n_questions=len({r["question_id"] for r in main}),
        n_runs=len({r["run_index"] for r in main}),
        em=pass_at_1(main, "em"),
        f1=pass_at_1(main, "f1"),
        acc=pass_at_1(main, "judge_correct") if has_judge else None,
        valid_rate=pass_at_1(main, "format_valid"),
        valid_em=pass_at_1(main, "em", valid_only=True),
        valid_f1=pass_at_1(main, "f1", valid_only=True),
        valid_acc=pass_at_1(main, "judge_correct", valid_only=True) if has_judge else None,
        n_judge_failed=sum(1 for r in main if r["format_valid"] and r.get("judge_model") and r["judge_correct"] is None),
        acc_second=pass_at_1(second, "judge_correct") if second else None,
    )


def _avg(values: Iterable[float | None]) -> float | None:
    vs = list(values)
    if not vs or any(v is None for v in vs):
        return None
    return sum(vs) / len(vs)  # type: ignore[arg-type]


def summarize(
    rows: Iterable[Mapping[str, Any]],
    *,
    splits: Sequence[str] | None = None,
    judge_model: str | None = None,
    second_judge_model: str | None = None,
) -> EvalSummary:
    """Per-split metrics and their average over splits for ``eval_results`` rows of ONE checkpoint.

    ``judge_model`` defaults to the only judge present (several judges without a choice is an error);
    ``splits`` fixes the order (default: the rows' splits, sorted). Averages are None when any split lacks a value.
    """
    rows = list(rows)
    for i, r in enumerate(rows):
        missing = [c for c in ("split", "question_id", "run_index", "format_valid", "em", "f1") if c not in r]
        if missing:
            raise EvalError(f"eval row {i}: missing column(s) {', '.join(missing)}")
    models = _judge_models(rows)
    candidates = [m for m in models if m != second_judge_model]
    if judge_model is None and len(candidates) > 1:
        raise EvalError(f"rows carry several judge models {models}; pass judge_model= (and second_judge_model=)")
    if judge_model is None and candidates:
        judge_model = candidates[0]
    for m in (judge_model, second_judge_model):
        if m is not None and m not in models:
            raise EvalError(f"judge model {m!r} not in the rows (present: {models or 'none'})")
    order = list(splits) if splits is not None else sorted({r["split"] for r in rows})
    by_split: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_split[r["split"]].append(r)
    absent = [s for s in order if s not in by_split]
    if absent:
        raise EvalError(f"no eval rows for split(s) {', '.join(absent)}")
    per = {s: split_metrics(by_split[s], s, judge_model=judge_model, second_judge_model=second_judge_model)
           for s in order}
    ms = list(per.values())
    average = SplitMetrics(
        split="Avg.",
        n_questions=sum(m.n_questions for m in ms),
        n_runs=max((m.n_runs for m in ms), default=0),
        em=_avg(m.em for m in ms), f1=_avg(m.f1 for m in ms), acc=_avg(m.acc for m in ms),
        valid_rate=_avg(m.valid_rate for m in ms), valid_em=_avg(m.valid_em for m in ms),
        valid_f1=_avg(m.valid_f1 for m in ms), valid_acc=_avg(m.valid_acc for m in ms),
        n_judge_failed=sum(m.n_judge_failed for m in ms),
        acc_second=_avg(m.acc_second for m in ms) if second_judge_model else None,
    )
    return EvalSummary(per, average, judge_model, second_judge_model)


# ---- printers (the paper's layouts) ------------------------------------------------------------------------------

def _pct(v: float | None, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{100 * v:+.1f}" if signed else f"{100 * v:.1f}"


def _grid(header: list[list[str]], body: list[list[str]]) -> str:
    allrows = header + body
    widths = [max(len(r[i]) for r in allrows) for i in range(len(allrows[0]))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))  # noqa: E731
    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([fmt(h) for h in header] + [rule] + [fmt(r) for r in body])


def format_table1(results: Mapping[str, EvalSummary]) -> str:
    """Table 1 / Table 7 layout: one row per method (or checkpoint), EM / F1 / Acc. per benchmark, then Avg."""
    if not results:
        return "(no results)"
    splits = list(next(iter(results.values())).splits)
    top = ["Method"] + [x for s in splits for x in (SPLIT_TITLES.get(s, s), "", "")] + ["Avg.", "", ""]
    sub = [""] + ["EM", "F1", "Acc."] * (len(splits) + 1)
    body = []
    for name, summ in results.items():
        if list(summ.splits) != splits:
            raise EvalError(f"{name!r} was evaluated on {list(summ.splits)}, the table on {splits}")
        cells = [name]
        for m in [*summ.splits.values(), summ.average]:
            cells += [_pct(m.em), _pct(m.f1), _pct(m.acc)]
        body.append(cells)
    return _grid([top, sub], body)


def format_table5(results: Mapping[str, EvalSummary]) -> str:
    """Table 5 layout (C.1): valid rate, official and valid-only LLM accuracy, recovery (averaged over splits)."""
    body = [[name, _pct(s.average.valid_rate), _pct(s.average.acc), _pct(s.average.valid_acc),
             _pct(s.average.recovery, signed=True)] for name, s in results.items()]
    return _grid([["Model", "Valid Rate", "Official LLM Acc.", "Valid-only LLM Acc.", "Recovery"]], body)


def format_table6(results: Mapping[str, EvalSummary], baseline: str | None = "grpo") -> str:
    """Table 6 layout (C.2): average accuracy under the main and the second judge, delta = second - main, and the
    gain over ``baseline`` (a key of ``results``) under each judge."""
    base = results.get(baseline) if baseline is not None else None
    body = []
    for name, s in results.items():
        a, b = s.average.acc, s.average.acc_second
        delta = None if a is None or b is None else b - a
        g1 = None if base is None or a is None or base.average.acc is None else a - base.average.acc
        g2 = None if base is None or b is None or base.average.acc_second is None else b - base.average.acc_second
        body.append([name, _pct(a), _pct(b), _pct(delta, signed=True), _pct(g1, signed=True), _pct(g2, signed=True)])
    any_s = next(iter(results.values()), None)
    j1 = (any_s.judge_model if any_s else None) or "judge"
    j2 = (any_s.second_judge_model if any_s else None) or "second judge"
    return _grid([["Method", j1, j2, "Delta", f"Gain ({j1})", f"Gain ({j2})"]], body)


def format_judges(summary: EvalSummary) -> str:
    """Table 6 columns for one checkpoint, per benchmark and Avg. (C.2): accuracy under the main judge, under the
    second judge, and delta = second - main."""
    j1, j2 = summary.judge_model or "judge", summary.second_judge_model or "second judge"
    body = []
    for m in [*summary.splits.values(), summary.average]:
        delta = None if m.acc is None or m.acc_second is None else m.acc_second - m.acc
        body.append([SPLIT_TITLES.get(m.split, m.split), _pct(m.acc), _pct(m.acc_second), _pct(delta, signed=True)])
    return _grid([["Benchmark", j1, j2, "Delta"]], body)


def format_summary(summary: EvalSummary, name: str = "checkpoint") -> str:
    """Everything one evaluation produced: Table 1 row, Table 5 row, and the Table 6 judge columns per benchmark
    when a second judge ran."""
    parts = [format_table1({name: summary}), "", format_table5({name: summary})]
    if summary.second_judge_model:
        parts += ["", format_judges(summary)]
    if summary.average.n_judge_failed:
        parts.append(f"\n{summary.average.n_judge_failed} judge call(s) failed and count as incorrect.")
    return "\n".join(parts)


# ---- storage -----------------------------------------------------------------------------------------------------

def evaluate_questions(engine: Any, judge: Any, questions_by_split: Mapping[str, Sequence[Any]], *, runs: int,
                       seed: int, run_id: str, step: int, checkpoint: str | None,
                       second_judge: Any = None, temperature: float | None = None,
                       guide: Any = None, guidance: str | None = None,
                       on_group: Callable[[list[Any]], None] | None = None) -> list[dict[str, Any]]:
    """Roll out every question once per evaluation run (seeded per run), score, judge; ``eval_results`` rows.
    ``on_group``: called with each finished answer (a group of one), for a progress display.

    ``second_judge`` (C.2) re-judges the very same predictions (no new rollouts): its rows follow, carrying its
    model in ``judge_model`` and its ledger stage ``eval-second``. ``guide`` (a ``tasks.methods.coreact.guidance.CoReAct``) answers
    the same questions a second time, with the same seeds, under Co-ReAct guidance: those rows carry ``guidance``
    and their guided turns collect in ``guide.records``. With a guide both passes follow Co-ReAct's inference
    protocol (App. A, ``guide.inference``): the agent at ``guidance.agent_temperature`` (greedy) instead of
    ``temperature`` and the trajectory budget ``guidance.trajectory_tokens``, so the comparison differs in the
    guidance only."""
    from contextlib import nullcontext

    async def judge_all(preds: list[Any], tag: str | None = None) -> list[dict[str, Any]]:
        kw: dict[str, Any] = {"run_id": run_id, "step": step, "checkpoint": checkpoint, "guidance": tag}
        jobs = [judge_predictions(judge, preds, stage="eval-guided" if tag else "eval", **kw)]
        if second_judge is not None and tag is None:
            jobs.append(judge_predictions(second_judge, preds, stage=SECOND_JUDGE_STAGE, **kw))
        try:
            return [row for rows in await asyncio.gather(*jobs) for row in rows]
        finally:  # network clients belong to this event loop (asyncio.run below): close them with it
            for j in (judge, second_judge):
                if j is not None:
                    await j.aclose()

    protocol = engine.loop.protocol.name  # the grammar the answers were written in
    rows: list[dict[str, Any]] = []
    saved_guide = getattr(engine, "guide", None)  # a run's guided training rollouts: evaluate unguided here
    engine.guide = None
    protocol_cm: Any = guide.inference(engine) if guide is not None else nullcontext(None)
    try:
        with protocol_cm as agent_temperature:
            if agent_temperature is not None:
                temperature = agent_temperature
            for split, questions in questions_by_split.items():
                rows += _evaluate_split(engine, split, questions, runs, seed, step, run_id, temperature, protocol,
                                        judge_all, guide, guidance, on_group)
    finally:
        engine.guide = saved_guide
    return rows


def _evaluate_split(engine: Any, split: str, questions: Sequence[Any], runs: int, seed: int, step: int, run_id: str,
                    temperature: float | None, protocol: str, judge_all: Any, guide: Any,
                    guidance: str | None, on_group: Callable[[list[Any]], None] | None = None) -> list[dict[str, Any]]:
    """``evaluate_questions`` for one split: each run unguided, then (with ``guide``) guided with the same seed."""
    import inspect

    from arbor.tasks.env.rollout import sampling_temperature  # torch: keep the CLI input checks fast

    takes = on_group is not None and "on_group" in inspect.signature(engine.generate_groups).parameters
    report: dict[str, Any] = {"on_group": on_group} if takes else {}  # a user's engine may not take it
    rows: list[dict[str, Any]] = []
    for r in range(runs):
        with sampling_temperature(engine, temperature):
            trajs = engine.generate_groups(list(questions), 1, derive_seed(seed, "eval", split, r), step,
                                           run_id=run_id, **report)
        rows += asyncio.run(judge_all([prediction_from_trajectory(t, split, r, protocol) for t in trajs]))
        if guide is None:
            continue
        guide.set_context(guide.ctx, run_id=run_id, step=step, split=split, run_index=r)
        engine.guide = guide
        try:
            with sampling_temperature(engine, temperature):
                trajs = engine.generate_groups(list(questions), 1, derive_seed(seed, "eval", split, r), step,
                                               run_id=run_id)
        finally:
            engine.guide = None
        rows += asyncio.run(judge_all([prediction_from_trajectory(t, split, r, protocol) for t in trajs],
                                      guidance or "co-react"))
    return rows


def store_eval_results(rows: Sequence[Mapping[str, Any]], *, run_id: str, step: int, stage: str = "eval",
                       home: Any = None) -> Any:
    """Write ``eval_results`` rows of one (run, step, stage) with ``storage.parquet.write_stage`` (atomic)."""
    from arbor.storage.parquet import write_stage

    return write_stage("eval_results", [dict(r) for r in rows], run_id=run_id, step=step, stage=stage, home=home)


def load_eval_results(run_id: str, step: int | None = None, *, checkpoint: str | None = None,
                      home: Any = None) -> list[dict[str, Any]]:
    """``eval_results`` rows of a run (its latest evaluated step when ``step`` is None) through the SQL view."""
    from arbor.storage.sql import run_file

    return run_file("eval_results_of_run", {"run_id": run_id, "step": None if step is None else int(step),
                                            "checkpoint": checkpoint}, home=home)
