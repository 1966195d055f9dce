"""arbor-train end to end: real Prefect, real DuckDB / Parquet, DeepSpeed on CPU, the tiny policy, the
openai judge over real HTTP against the local OpenAI-compatible test server.

One session-scoped reference run; every resume test continues the same configuration in a fresh workspace with a
fresh judge server, fails it on purpose, resumes it, and compares the stored results with the reference. Step 1 of
the resume tests' run is computed once (``failed_in_step_2``: the run fails in step 2's first stage) and each test
continues its own copy of that workspace, for CI time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from flow_support import (
    JUDGE_KEY,
    JUDGE_KEY_ENV,
    comparable_events,
    judge_server,
    openai_judge,
    retriever,
    shaped_rewards,
    table,
    tiny_overrides,
)

from arbor.config import ArborConfig
from arbor.tasks.methods.arbor import Arbor
from arbor.tasks.stage_store import InjectedFault

pytestmark = pytest.mark.slow

RUN = "ref"


def _train(home: Path, run_id: str, overrides: dict, resume: bool = False) -> str:
    from arbor.flows.train import arbor_train

    os.environ["ARBOR_HOME"] = str(home)
    return arbor_train(profile="tiny-cpu", overrides=overrides, run_id=run_id, resume=resume)


@pytest.fixture(scope="module")
def reference(reference_run):
    """The uninterrupted run every resume test compares against (conftest); its judge server's request counts."""
    home, counts, _ = reference_run
    return home, counts


@pytest.fixture(scope="module")
def failed_in_step_2(reference, sft_policy: Path, tmp_path_factory: pytest.TempPathFactory):
    """The reference's configuration run in a fresh workspace against a fresh judge server, failed (``ARBOR_FAULT``)
    in step 2's first stage: step 1 complete and stored, nothing of step 2 stored. (workspace, its judge server's
    request count per prompt). Each resume test continues a copy of it (``_continue``) against a judge server of
    its own: the workspace moves (the catalog rebinds), the judge endpoint is a change a resume accepts."""
    home = tmp_path_factory.mktemp("failed_in_step_2")
    first = Arbor.stage_names()[0]
    with judge_server() as srv, pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARBOR_FAULT", f"2:{first}")
        with pytest.raises(InjectedFault):
            _train(home, RUN, {**tiny_overrides(sft_policy), **openai_judge(srv.base_url)})
        counts = dict(srv.counts)
    done = {(s["step"], s["stage"]) for s in table("stage_runs", RUN, home) if s["status"] == "completed"}
    assert done == {(1, stage) for stage in Arbor.stage_names()}, done
    assert counts and max(counts.values()) == 1
    return home, counts


def _continue(failed: tuple[Path, dict], tmp_path: Path) -> Path:
    """A copy of ``failed_in_step_2``'s workspace under ``tmp_path``, to resume."""
    home = tmp_path / "home"
    shutil.copytree(failed[0], home, symlinks=True)
    return home


def _paid(failed: tuple[Path, dict], srv) -> Counter:
    """How often each judge prompt reached a server over the run's whole life: the failed run's server (step 1 and
    the judging step 2's failed first stage streamed), then this test's."""
    return Counter(failed[1]) + Counter(srv.counts)


def test_two_step_run_satisfies_lifecycle_invariants(reference) -> None:
    home, counts = reference
    events = sorted(table("rubric_events", RUN, home), key=lambda e: (e["step"], e["seq"]))
    acts = table("rubric_activations", RUN, home)
    assert counts and max(counts.values()) == 1  # every judge prompt reached the server once
    steps = sorted(table("steps", RUN, home), key=lambda r: r["step"])
    assert len(steps) == 2
    # the resolved config beside the run's artifacts: the stored config, each value's source, no secret
    written = (home / "runs" / RUN / "config.yaml").read_text()
    stored = ArborConfig.model_validate_json(table("runs", RUN, home)[0]["config_json"])
    assert ArborConfig.model_validate(yaml.safe_load(written)) == stored
    assert '  model: "test-judge"  # override' in written and "  eps_clip_low: 0.2  # default" in written
    assert JUDGE_KEY not in written
    # step 1 trains version-0 rollouts with version-0 weights at the rollout temperature: TIS weights are 1
    assert abs(steps[0]["tis_mean"] - 1.0) < 1e-3 and steps[0]["tis_clip_frac"] == 0.0, steps[0]
    kinds = {e["event"] for e in events}
    assert {"induced", "admitted", "consolidated", "activated"} <= kinds, kinds
    pool_max, n_active, delta_v, rho_min = 6, 2, 0.05, 0.0
    assert all((e["pool_size"] or 0) <= pool_max for e in events)
    # eq. 2 from the recorded statistics: every admission passed it, every rejection with statistics failed it
    # (retirement in two steps of this run: none; its rule is tested in test_memory_lifecycle.py)
    admitted = [e for e in events if e["event"] == "admitted"]
    rejected = [e for e in events if e["event"] == "rejected" and e["variance"] is not None]
    assert admitted and rejected, kinds
    assert all(e["variance"] >= delta_v - 1e-12 and (e["pearson"] is None or e["pearson"] >= rho_min - 1e-12)
               for e in admitted), admitted
    assert all(e["variance"] < delta_v or (e["pearson"] is not None and e["pearson"] < rho_min)
               for e in rejected), rejected
    for step in (1, 2):
        before = [e["pool_size"] for e in events if e["step"] < step and e["pool_size"] is not None]
        pool_before = before[-1] if before else 0  # |P| after the last event of the earlier steps
        activated = [e for e in events if e["step"] == step and e["event"] == "activated"]
        assert len(activated) == min(n_active, pool_before)
        groups = {a["group"] for a in acts if a["step"] == step}
        for rid in {e["rubric_id"] for e in activated}:  # an active rubric scores every group of the step
            assert {a["group"] for a in acts if a["step"] == step and a["rubric_id"] == rid} == groups
    # shaping: R_total = R_base + lambda * term, so a format-invalid trajectory keeps its base reward exactly
    invalid = [t for t in table("trajectories", RUN, home) if not t["format_valid"]]
    assert invalid and all(t["shaped_reward"] == t["base_reward"] == -1.0 for t in invalid)


def test_resume_after_failure_in_each_stage(reference, failed_in_step_2, sft_policy: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 2 fails in each of ARBOR's stages in turn: the run fails in its first stage (``failed_in_step_2``), each
    resume fails in the next one (so every stage is resumed from a failure once; one run instead of one a stage, for
    CI time), and the last resume completes. Nothing of a failed stage is stored, no judge prompt is paid twice, and
    the stored results are the uninterrupted reference's."""
    ref_home, _ = reference
    home = _continue(failed_in_step_2, tmp_path)
    with judge_server() as srv:
        o = {**tiny_overrides(sft_policy), **openai_judge(srv.base_url)}
        for i, stage in enumerate(Arbor.stage_names()):
            if i > 0:  # the first stage's failure is the copied run's
                monkeypatch.setenv("ARBOR_FAULT", f"2:{stage}")
                with pytest.raises(InjectedFault):
                    _train(home, RUN, o, resume=True)
            assert not any(s["stage"] == stage and s["step"] == 2 for s in table("stage_runs", RUN, home)
                           if s["status"] == "completed"), stage
            done = {s["stage"] for s in table("stage_runs", RUN, home) if s["step"] == 2 and s["status"] == "completed"}
            assert done == set(Arbor.stage_names()[:i]), (stage, done)  # the earlier stages, resumed, are kept
        monkeypatch.delenv("ARBOR_FAULT")
        _train(home, RUN, o, resume=True)
        assert srv.counts and max(_paid(failed_in_step_2, srv).values()) == 1, "a judge prompt reached the server twice"
    assert comparable_events(RUN, home) == comparable_events(RUN, ref_home)
    assert shaped_rewards(RUN, home) == shaped_rewards(RUN, ref_home)
    assert [r["loss"] for r in sorted(table("steps", RUN, home), key=lambda r: r["step"])] == pytest.approx(
        [r["loss"] for r in sorted(table("steps", RUN, ref_home), key=lambda r: r["step"])], abs=1e-6)


def test_resume_after_sigkill_mid_stage(reference, failed_in_step_2, sft_policy: Path, tmp_path: Path,
                                        prefect_harness) -> None:
    """The run (``failed_in_step_2``) is resumed by ``arbor train --resume`` and SIGKILLed in the middle of step 2's
    score stage; nothing of the stage is stored, the next resume completes, no judge prompt is paid twice, and the
    stored results are the reference's."""
    ref_home, _ = reference
    home = _continue(failed_in_step_2, tmp_path)
    with judge_server() as srv:
        o = {**tiny_overrides(sft_policy), **openai_judge(srv.base_url)}
        sets = [f"--set={k}={v}" for k, v in o.items()]
        from prefect.settings import PREFECT_API_URL

        # The harness's server: a SIGKILLed flow must not leave a temporary server of its own behind (holding pipes).
        env = {**os.environ, "ARBOR_HOME": str(home), "ARBOR_FAULT": "2:score:kill-mid", JUDGE_KEY_ENV: JUDGE_KEY,
               "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        log = tmp_path / "killed.log"
        with open(log, "w") as out:
            proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "--resume", RUN, *sets], env=env,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=600)
        assert proc.returncode == -9, log.read_text()[-2000:]  # SIGKILLed mid-stage
        assert not any(s["stage"] == "score" and s["step"] == 2 for s in table("stage_runs", RUN, home))
        _train(home, RUN, o, resume=True)
        assert srv.counts and max(_paid(failed_in_step_2, srv).values()) == 1
    assert comparable_events(RUN, home) == comparable_events(RUN, ref_home)
    assert shaped_rewards(RUN, home) == shaped_rewards(RUN, ref_home)


def test_a_damaged_stage_stops_the_resume_and_redo_recomputes_it(reference, failed_in_step_2, sft_policy: Path,
                                                                  tmp_path: Path, prefect_harness,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 2 (resumed from ``failed_in_step_2``) fails before shaping; one flipped byte in step 2's stored score
    file then stops the resume naming the file and the remedy, and ``--resume R --redo 2:score`` discards score and what followed it,
    recomputes them (the judge's cache answers: no prompt reaches the server twice) and ends as the reference."""
    from arbor.storage.parquet import StageCorrupt, stage_path

    ref_home, _ = reference
    home = _continue(failed_in_step_2, tmp_path)
    with judge_server() as srv:
        o = {**tiny_overrides(sft_policy), **openai_judge(srv.base_url)}
        monkeypatch.setenv("ARBOR_FAULT", "2:shape")
        with pytest.raises(InjectedFault):
            _train(home, RUN, o, resume=True)
        monkeypatch.delenv("ARBOR_FAULT")
        path = Path(stage_path("rubric_activations", run_id=RUN, step=2, stage="score", home=home))
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
        with pytest.raises(StageCorrupt, match=f"--resume {RUN} --redo 2:score") as err:
            _train(home, RUN, o, resume=True)
        assert str(path) in str(err.value)
        from prefect.settings import PREFECT_API_URL

        env = {**os.environ, "ARBOR_HOME": str(home), JUDGE_KEY_ENV: JUDGE_KEY,
               "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        env.pop("ARBOR_FAULT", None)
        bad = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "--resume", RUN, "--redo", "2:train"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "no committed stage 'train' at step 2" in bad.stderr, bad.stderr[-2000:]
        proc = subprocess.run([sys.executable, "-m", "arbor.cli", "train", "--resume", RUN, "--redo", "2:score"],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "redo: discarded 3 stored stages of run ref from step 2 (score on)" in proc.stderr
        assert srv.counts and max(_paid(failed_in_step_2, srv).values()) == 1, "a judge prompt reached the server twice"
    assert comparable_events(RUN, home) == comparable_events(RUN, ref_home)
    assert shaped_rewards(RUN, home) == shaped_rewards(RUN, ref_home)


def test_export_and_warm_start_rubric_pool(reference, sft_policy: Path, tmp_path: Path) -> None:
    import json

    from arbor.flows.pool import export_pool

    ref_home, _ = reference
    events = table("rubric_events", RUN, ref_home)
    # the pool after step 1 is what step 1 consolidated, less what it retired (retirement may empty it by step 2)
    p1 = {e["rubric_id"] for e in events if e["step"] == 1 and e["event"] == "consolidated" and e["rubric_id"][0] == "c"}
    p1 -= {e["rubric_id"] for e in events if e["step"] == 1 and e["event"] == "retired"}
    data = export_pool(RUN, ref_home, step=1)
    assert data["source_step"] == 1
    exported = [r["title"] for r in data["rubrics"]]
    assert exported, "the reference run consolidated no common rubric at step 1"
    assert {r["rubric_id"] for r in data["rubrics"]} == p1
    with pytest.raises(ValueError, match="step 3 is outside"):
        export_pool(RUN, ref_home, step=3)
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps(data))
    home = tmp_path / "home"
    # one step of 4 prompts x K=4 (the warm start is loaded and activated whatever the batch)
    _train(home, "warm", tiny_overrides(sft_policy, **{"run.steps": 1, "rollout.batch_size": 4,
                                                       "memory.init_from": str(pool)}))
    events = table("rubric_events", "warm", home)
    loaded = [e["title"] for e in sorted(events, key=lambda e: e["seq"]) if e["event"] == "consolidated"
              and e["step"] == 1 and (e["reason"] or "").startswith("warm start")]
    assert loaded == exported
    assert {e["rubric_id"] for e in events if e["event"] == "activated"} <= {f"w{i}" for i in range(len(exported))}
    assert len([e for e in events if e["event"] == "activated"]) == min(2, len(exported))


def test_the_final_policy_is_listed_and_exports_as_a_plain_hf_folder(reference, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`arbor runs` names the finished run's policy (the last step's checkpoint), and `arbor export`
    copies it to a new folder that transformers loads with the checkpoint's exact weights."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from typer.testing import CliRunner

    from arbor.cli import app

    ref_home, _ = reference
    monkeypatch.setenv("ARBOR_HOME", str(ref_home))
    runner = CliRunner()
    res = runner.invoke(app, ["runs", "--format", "json"])
    assert res.exit_code == 0, res.output
    (row,) = [r for r in json.loads(res.output) if r["run_id"] == RUN]
    last = ref_home / "checkpoints" / RUN / "step_000002" / "hf"
    assert row["policy"] == str(last)
    out = tmp_path / "final"
    res = runner.invoke(app, ["export", RUN, "--out", str(out)])
    assert res.exit_code == 0, res.output
    exported, source = AutoModelForCausalLM.from_pretrained(out), AutoModelForCausalLM.from_pretrained(last)
    assert AutoTokenizer.from_pretrained(out)("who").input_ids
    theirs = source.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in exported.state_dict().items())
    assert json.loads((out / "arbor_export.json").read_text())["step"] == 2
    again = runner.invoke(app, ["export", RUN, "--out", str(out)])
    assert again.exit_code == 2 and "already exists" in again.output
    missing = runner.invoke(app, ["export", RUN, "--out", str(tmp_path / "x"), "--step", "9"])
    assert missing.exit_code == 2 and "step 9" in missing.output and not (tmp_path / "x").exists()
    unknown = runner.invoke(app, ["export", "nope", "--out", str(tmp_path / "y")])
    assert unknown.exit_code == 2 and "no run 'nope'" in unknown.output


def test_frozen_memory_admits_and_retires_nothing(sft_policy: Path, tmp_path: Path, prefect_harness) -> None:
    home = tmp_path / "home"
    _train(home, "frozen", tiny_overrides(sft_policy, **{"run.steps": 1, "memory.frozen": True}))
    assert not [e for e in table("rubric_events", "frozen", home)
                if e["event"] in ("induced", "admitted", "consolidated", "retired")]


def book_corpus(tmp_path: Path) -> Path:
    """Twenty passages "Book i was written by Author i." as a JSONL corpus (the questions of ``_question_rows``)."""
    import json

    corpus = tmp_path / "my_corpus.jsonl"
    corpus.write_text("".join(json.dumps({"title": f"Book {i}", "text": f"Book {i} was written by Author {i}."})
                              + "\n" for i in range(20)))
    return corpus


def _question_rows(fmt: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Four questions in one of the formats users have; (data path, field overrides).
    Parquet and the remaining combinations are read in tests/test_data_formats.py."""
    import json

    qs = [(f"q{i}", f"Who wrote book number {i}?", f"Author {i}") for i in range(4)]
    if fmt == "jsonl":  # arbor's own
        path = tmp_path / "my_questions.jsonl"
        path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for _, q, a in qs))
        return str(path), {}
    if fmt == "flashrag-jsonl":  # FlashRAG / Search-R1 rows: id, question, golden_answers
        path = tmp_path / "nq_train.jsonl"
        path.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": [a, a.lower()]}) + "\n"
                                for i, q, a in qs))
        return str(path), {}
    assert fmt == "verl-hf"  # verl's nested RL rows as Search-R1 writes them, saved by HF datasets' save_to_disk
    import datasets

    path = tmp_path / "my_verl_dataset"
    datasets.Dataset.from_list([
        {"data_source": "books", "prompt": [{"role": "user", "content": f"(template) {q}"}],
         "reward_model": {"style": "rule", "ground_truth": {"target": [a]}}, "extra_info": {"index": i, "question": q}}
        for i, q, a in qs]).save_to_disk(str(path))
    return str(path), {"data.question_field": "extra_info.question", "data.answer_field": "reward_model.ground_truth",
                       "data.id_field": "extra_info.index"}


@pytest.mark.parametrize("fmt", ["jsonl", "verl-hf"])
def test_users_own_dataset_and_corpus(tmp_path: Path, prefect_harness, fmt: str) -> None:
    """`--set data.train=... --set search.corpus=...` run one step on a user's files (random tiny policy), in each
    data format arbor reads."""

    data, fields = _question_rows(fmt, tmp_path)
    corpus = book_corpus(tmp_path)
    home = tmp_path / "home"
    o = {"run.steps": 1, "run.sft_warm_start": False, "data.train": data, "search.corpus": str(corpus),
         "rollout.batch_size": 2, "rollout.k": 2, "rollout.max_new_tokens_per_turn": 16, "rollout.max_turns": 2,
         **fields}
    o.update({"data.eval": data, "run.eval_every": 1, "run.eval_size": 2, "run.eval_runs": 1})
    _train(home, "mine", o)
    trajs = table("trajectories", "mine", home)
    assert len(trajs) == 4 and {t["question"] for t in trajs} <= {f"Who wrote book number {i}?" for i in range(4)}
    assert {t["golds"][0] for t in trajs} <= {f"Author {i}" for i in range(4)}
    if fmt != "jsonl":  # the file's own ids, not line numbers
        assert {t["question_id"] for t in trajs} <= {f"q{i}" for i in range(4)}
    # run.eval_at_start: the starting policy is evaluated as step 0, before the first RL step (then step 1)
    evals = table("eval_results", "mine", home)
    assert sorted({(e["step"], e["checkpoint"]) for e in evals}) == [(0, "policy-v0"), (1, "policy-v1")]
    assert len(evals) == 4  # 2 questions x 1 run at each evaluated step


def test_eval_final_evaluates_the_final_policy_and_reports_table1(tmp_path: Path, prefect_harness) -> None:
    """run.eval_final (the paper profiles' Table 1): no in-run cadence, the final policy alone is evaluated, as the
    last step's eval stage; the report's Table 1 shows it, per split, as eval_summary reads it."""

    from arbor.storage.sql import run_file
    from arbor.tasks.reporting.report import build_report

    data, fields = _question_rows("jsonl", tmp_path)
    corpus = book_corpus(tmp_path)
    home = tmp_path / "home"
    o = {"run.steps": 2, "run.sft_warm_start": False, "data.train": data, "search.corpus": str(corpus),
         "rollout.batch_size": 2, "rollout.k": 2, "rollout.max_new_tokens_per_turn": 16, "rollout.max_turns": 2,
         "run.method": "grpo", "data.eval": data, "run.eval_final": True, "run.eval_size": 3, "run.eval_runs": 2,
         **fields}
    _train(home, "final", o)
    evals = table("eval_results", "final", home)
    assert sorted({(e["step"], e["checkpoint"]) for e in evals}) == [(2, "policy-v2")] and len(evals) == 6
    summary = run_file("eval_summary_of_runs", {"run_ids": ["final"]}, home=home)
    assert len(summary) == 1 and summary[0]["n_questions"] == 3
    md = build_report("final", home=home).markdown.read_text()
    assert "## Table 1: the final evaluation on the test splits" in md
    f1 = f"{100 * summary[0]['strict_f1']:.1f} ± "
    f1_table = md.split("**F1**")[1].split("**LLM-judge acc.**")[0]
    assert f"| final | {f1}" in f1_table, f1_table
    # arbor-eval's checkpoint may name the run: its final policy, the step-2 checkpoint's hf/ folder
    from arbor.flows.evaluate import resolve_checkpoint

    assert resolve_checkpoint("final", home) == str(home / "checkpoints" / "final" / "step_000002" / "hf")
    assert resolve_checkpoint("Qwen/Qwen3-8B", home) == "Qwen/Qwen3-8B"
    assert resolve_checkpoint("no-such-run", home) == "no-such-run"
    # an evaluation never takes a stored run's id: refused before anything is written, the record unchanged
    from arbor.flows.evaluate import run_eval
    from arbor.storage.runs import RunRefused

    before = table("runs", "final", home)
    with pytest.raises(RunRefused, match="'final' already exists"):
        run_eval(checkpoint="final", profile="tiny-cpu", overrides=o, run_id="final")
    assert table("runs", "final", home) == before
    assert not (home / "locks" / "final.lock").exists()


def test_plugins_run_one_step(sft_policy: Path, tmp_path: Path, prefect_harness) -> None:
    """reward.fn, search.backend and judge.backend by import path: one step through the flow. The
    SFT-started policy searches (a randomly initialised one never writes a search call, so the plug-in search
    backend would go unused)."""
    import json

    data, _ = _question_rows("flashrag-jsonl", tmp_path)
    corpus = book_corpus(tmp_path)
    home = tmp_path / "home"
    o = {"run.steps": 1, "run.sft_warm_start": False, "run.start_checkpoint": str(sft_policy), "data.train": data,
         "data.eval": data, "search.corpus": str(corpus), "rollout.batch_size": 2, "rollout.k": 2,
         "rollout.max_new_tokens_per_turn": 48, "rollout.max_turns": 2, "run.eval_every": 1, "run.eval_size": 2,
         "run.eval_runs": 1,
         "reward.fn": "examples.search_cost_reward:em_minus_search_cost",
         "search.backend": "examples.keyword_search:KeywordSearch",
         "judge.backend": "examples.lenient_judge:LenientJudge",
         "run.method": "rar",  # RaR asks the judge about every group, whatever the tiny policy wrote
         # every logger, offline (W&B) and local (MLflow's SQLite store)
         "tracking.loggers": ["console", "tensorboard", "wandb", "mlflow"], "tracking.wandb_mode": "offline",
         "tracking.project": "arbor-flow-test", "tracking.samples_per_step": 2}
    _train(home, "plugins", o)
    trajs = table("trajectories", "plugins", home)
    assert len(trajs) == 4 and {t["question_id"] for t in trajs} <= {f"q{i}" for i in range(4)}
    for t in trajs:  # the plug-in's reward behind arbor's format gate
        assert t["base_reward"] == (pytest.approx(t["em"] - 0.05 * t["search_calls"]) if t["format_valid"] else -1.0)
    calls = table("judge_calls", "plugins", home)
    assert calls and {c["backend"] for c in calls} == {"lenient-rules"}
    import sqlite3

    with sqlite3.connect(home / "cache" / "search" / "entries.sqlite3") as con:
        cached = [json.loads(v) for (v,) in con.execute("select value from kv")]
    assert sum(t["search_calls"] for t in trajs) > 0
    assert cached and all(c["backend"].startswith("keyword:") for c in cached)
    _assert_tracked(home, "plugins")


def _assert_tracked(home: Path, run_id: str) -> None:
    """The W&B offline run and the MLflow run hold the grouped metrics of step 1, the evaluation of steps 0 and 1,
    and the step's sample table. RaR keeps no rubric memory, so nothing of one is logged (``Method.logged_metrics``:
    ARBOR's own)."""
    from flow_support import wandb_history
    from mlflow.tracking import MlflowClient

    from arbor.tasks.reporting.tracking import mlflow_local_uri

    grouped = {"reward/base_mean", "reward/zero_var_groups_total", "actor/pg_loss", "actor/grad_norm",
               "rollout/searches_mean", "judge/calls", "timing_s/step", "timing_s/rollout"}
    [run_dir] = (home / "wandb").glob(f"offline-run-*-{run_id}")
    hist = wandb_history(run_dir)
    by_step = {r["_step"]: r for r in hist}
    assert grouped <= set(by_step[1]) and by_step[1]["samples/nrows"] == 2
    inside = {k: v for k, v in by_step[1].items() if k.startswith("timing_s/train_")}  # the update's passes
    stages = {k: v for k, v in by_step[1].items()
              if k.startswith("timing_s/") and k != "timing_s/step" and k not in inside}
    # a step's time counts its training, the checkpoint's and the weight sync's shares and its evaluation
    assert {"timing_s/train", "timing_s/eval", "timing_s/checkpoint", "timing_s/sync"} <= set(stages)
    assert by_step[1]["timing_s/step"] == pytest.approx(sum(stages.values()))
    assert {"timing_s/train_forward", "timing_s/train_backward", "timing_s/train_optimizer"} <= set(inside)
    assert 0 < sum(inside.values()) <= stages["timing_s/train"]
    assert by_step[1]["judge/calls"] > 0 and not [k for k in by_step[1] if k.startswith(("rubric/", "signal/"))]
    evals = {k for r in hist for k in r if k.startswith("eval/")}
    assert any(k.endswith("/strict_f1") for k in evals) and {0, 1} <= {r["_step"] for r in hist if evals & set(r)}
    stored = table("eval_results", run_id, home)  # the logged scores are the stored answers' strict means
    for step in (0, 1):
        mine = [e for e in stored if e["step"] == step]
        [key] = [k for k in by_step[step] if k.startswith("eval/") and k.endswith("/strict_f1")]
        assert by_step[step][key] == pytest.approx(sum(e["f1"] for e in mine) / len(mine))
    client = MlflowClient(tracking_uri=mlflow_local_uri(home))
    [run] = client.search_runs([client.get_experiment_by_name("arbor-flow-test").experiment_id])
    assert grouped <= set(run.data.metrics) and run.data.tags["arbor.run_id"] == run_id
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples")] == ["samples/step_000001.json"]


def test_search_r1_protocol_one_step(tmp_path: Path, prefect_harness, sft_starts) -> None:
    """A Search-R1 user's setup: FlashRAG-format questions, a Search-R1 retriever over HTTP and
    ``rollout.protocol=search-r1``. The policy is SFT'd briefly on world trajectories written in Search-R1's tags
    (75 updates: it searches, rarely answers well), then one ARBOR step with the rules judge runs through the flow."""
    import json

    from arbor.config import load_config
    from arbor.format import SEARCH_R1, check_format
    from arbor.tasks.env.datasets import load_questions
    from arbor.tasks.env.search import make_search

    r1 = {"rollout.protocol": "search-r1", "rollout.system_prompt": None}
    start = sft_starts("tiny-world", {**r1, "sft.questions": 300, "sft.epochs": 1})
    cfg = load_config("tiny-world")
    data = tmp_path / "world_eval_flashrag.jsonl"  # FlashRAG / Search-R1 rows: id, question, golden_answers
    data.write_text("".join(json.dumps({"id": q.question_id, "question": q.question, "golden_answers": list(q.golds)})
                            + "\n" for q in load_questions("world:eval", config=cfg)[:8]))
    home = tmp_path / "home"
    os.environ["ARBOR_HOME"] = str(home)
    with retriever(make_search(cfg.search, home=home, config=cfg)) as server:
        from arbor.flows.train import arbor_train

        arbor_train(profile="tiny-world", run_id="r1", overrides={
            **r1, "run.steps": 1, "run.sft_warm_start": False, "run.start_checkpoint": str(start),
            "search.backend": "http", "search.url": server.url + "/retrieve", "data.train": str(data),
            "data.eval": str(data), "rollout.batch_size": 4, "rollout.k": 4, "run.eval_every": 1,
            "run.eval_size": 4, "run.eval_runs": 1})
    assert server.requests and {(r["path"], r["body"]["topk"]) for r in server.requests} == {("/retrieve", 1)}
    trajs = table("trajectories", "r1", home)
    assert len(trajs) == 16 and not any("<result>" in t["text"] for t in trajs)
    searched = [t for t in trajs if t["search_calls"]]
    assert searched and all("</search>\n\n<information>" in t["text"] for t in searched)
    assert any("<information>Doc 1(Title: " in t["text"] for t in searched)  # Search-R1's passage lines
    for t in trajs:  # the stored verdicts are Search-R1's checker's
        fmt = check_format(t["text"], truncated=t["finish_reason"] in ("length", "max_turns"), protocol=SEARCH_R1)
        assert (t["format_valid"], t["answer"]) == (fmt.valid, fmt.answer)
        assert t["base_reward"] == (pytest.approx(t["f1"]) if fmt.valid else -1.0)
    stored = json.loads(table("runs", "r1", home)[0]["config_json"])
    assert stored["rollout"]["protocol"] == "search-r1"
    assert len(table("eval_results", "r1", home)) == 8  # 4 questions at steps 0 and 1, read by the same checker
