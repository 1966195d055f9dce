"""Bad input is refused before anything starts, resumes change only what is safe, and `arbor runs` tells a
live run from one whose process was killed.

The acceptance commands run as a new user would: `.venv/bin/arbor` subprocesses in a fresh workspace and working
directory, with no telemetry variables exported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbor.config import ConfigError, load_config
from arbor.storage.parquet import write_stage

ARBOR = str(Path(sys.executable).parent / "arbor")
QUIET = ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED", "HF_HUB_DISABLE_TELEMETRY", "PREFECT_API_URL")


@pytest.fixture
def user(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh working directory and workspace holding one stored run 'r1' (tiny-cpu, 5 steps)."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in QUIET}
    env.update(ARBOR_HOME=str(home), PREFECT_HOME=str(tmp_path / "prefect"))
    cfg = load_config("tiny-cpu")
    cfg.run.run_id = "r1"
    write_stage("runs", [{"profile": "tiny-cpu", "method": "arbor", "seed": 0, "config_json": cfg.to_json(),
                          "created_at": time.time()}], run_id="r1", step=0, stage="run", home=home)
    return tmp_path, env


BAD = [  # (arguments, what the one line must name)
    (["train", "--resume", "nope"], ["'nope'"]),
    (["rubrics", "export", "nope"], ["'nope'"]),
    (["export", "nope", "--out", "policy"], ["no run 'nope'", "runs` lists them"]),
    (["report", "nope"], ["'nope'"]),
    (["compare", "--methods", "foo"], ["foo"]),
    (["eval", "--set", "run.nonexistent=1"], ["run.nonexistent"]),
    (["train", "--set", "train.deepspeed_config=missing.json"], ["train.deepspeed_config", "{cwd}/missing.json"]),
    (["train", "--set", "rollout.top_p=0.9"], ["rollout.top_p", "train.tis_cap"]),
    (["train", "--set", "rollout.k=1"], ["rollout.k"]),
    (["train", "--run-id", "r1"], ["'r1'", "--resume r1"]),
    (["train", "--resume", "r1", "--set", "rollout.k=4"], ["rollout.k", "'r1'"]),
    (["compare", "--methods", "grpo,dapo", "--set", "memory.lamda=1"], ["memory.lamda"]),
    (["demo", "--set", "memory.init_from=pool.json"], ["memory.init_from", "{cwd}/pool.json"]),
    (["disk", "../.."], ["'../..'"]),  # walked outside ARBOR_HOME
    (["eval", "--limit", "-1"], ["--limit -1", "at least 1"]),  # was every question but the last
    (["eval", "--runs", "0"], ["--runs 0", "at least 1"]),  # was silently 5
    (["train", "--set", "run.steps=100000000000000000000000"], ["run.steps", "10000000"]),
    # a credential in an endpoint URL would be stored with the run (config, Parquet, logs): refused, never echoed
    (["train", "--set", "judge.backend=openai", "--set", "judge.base_url=http://judgeuser:pa55word@127.0.0.1:9/v1"],
     ["judge.base_url", "carries a credential (user:password@)", "api_key_env"]),
    (["train", "--set", "judge.roles.pairwise.base_url=http://127.0.0.1:9/v1?api_key=sk-in-the-query"],
     ["judge.roles.pairwise.base_url", "the query parameter 'api_key'"]),
    (["train", "--resume", "r1", "--set", "judge.base_url=http://judgeuser:pa55word@127.0.0.1:9/v1"],
     ["judge.base_url", "carries a credential"]),
    (["train", "--set", "rollout.base_url=http://vllm:pa55word@127.0.0.1:9/v1"], ["rollout.base_url"]),
    (["train", "--set", "search.url=http://127.0.0.1:9/search?token=sk-in-the-query"], ["search.url"]),
    # any URL-typed field, and a key where its variable's name belongs, on a new run or a resume
    (["train", "--set", "tracking.mlflow_tracking_uri=http://u:pa55word@127.0.0.1:9"],
     ["tracking.mlflow_tracking_uri", "carries a credential"]),
    (["train", "--resume", "r1", "--set", "judge.api_key_env=sk-in-the-query"],
     ["judge.api_key_env", "must name the environment variable"]),
    # values outside their meaning, on a resume too
    (["train", "--resume", "r1", "--set", "run.steps=0"], ["run.steps", "greater than or equal to 1"]),
    (["train", "--set", "train.lr=.inf"], ["train.lr", "finite"]),
    (["train", "--set", "memory.delta_v=0.3"], ["memory.delta_v", "0.25"]),
]
SECRETS = ("pa55word", "sk-in-the-query")


@pytest.mark.parametrize(("args", "named"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_at_once_with_one_line(user, args: list[str], named: list[str]) -> None:
    cwd, env = user
    t0 = time.perf_counter()
    out = subprocess.run([ARBOR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - t0
    lines = out.stderr.splitlines()
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    assert "Traceback" not in out.stderr + out.stdout
    for name in named:
        assert name.format(cwd=cwd) in lines[0], lines[0]
    assert not any(secret in out.stderr + out.stdout for secret in SECRETS), lines[0]
    assert wall < 3.0, f"{wall:.1f} s"
    assert not (cwd / "prefect").exists(), "Prefect was started"
    assert not (cwd / "home" / "catalog.duckdb").exists()


BINARY = bytes(range(256)) * 8
FILES = {  # what the cases below write into the working directory
    "empty.jsonl": b"", "blank.jsonl": b"  \n\n", "binary.jsonl": BINARY,
    "surrogate.jsonl": b'{"question": "born in \\ud800 where?", "answer": "x"}\n',
    "corpus.jsonl": b"\n \n", "badplug.py": b"raise RuntimeError('boom at import')\n",
    "sleepplug.py": b"import time\ntime.sleep(600)\n",
}
BAD_FILES = [  # each once a traceback, most of them after the flow had started
    (["train", "--set", "data.train=empty.jsonl"], ["data.train", "empty.jsonl: holds no questions"]),
    (["train", "--set", "data.train=blank.jsonl"], ["data.train", "blank.jsonl: holds no questions"]),
    (["train", "--set", "data.train=binary.jsonl"], ["data.train", "binary.jsonl:1: not UTF-8"]),
    (["train", "--set", "data.train=surrogate.jsonl"], ["surrogate.jsonl:1", "lone surrogate", "\\ud800"]),
    (["train", "--set", "search.corpus=corpus.jsonl"], ["search.corpus", "the corpus is empty"]),
    (["train", "--set", "search.corpus=binary.jsonl"], ["search.corpus", "binary.jsonl:1: not UTF-8"]),
    (["train", "--run-id", "r" * 300], ["run id", "{0,127}"]),  # was `File name too long` from the lock file
    (["train", "--set", "run.method=badplug:Method"], ["run.method", "RuntimeError: boom at import"]),
    (["train", "--set", "run.method=sleepplug:Method"], ["run.method", "still importing after 0.3 s"]),
    (["eval", "--split", "nosuch"], ["--split nosuch", "neither a named split"]),
    (["eval", "/no/such/checkpoint"], ["'/no/such/checkpoint' does not exist"]),
]


@pytest.mark.parametrize(("args", "named"), BAD_FILES, ids=[" ".join(a)[:60] for a, _ in BAD_FILES])
def test_bad_files_and_plugins_exit_2_at_once_with_one_line(user, args: list[str], named: list[str]) -> None:
    cwd, env = user
    for name, data in FILES.items():
        (cwd / name).write_bytes(data)
    env = {**env, "PYTHONPATH": str(cwd), "ARBOR_PLUGIN_IMPORT_TIMEOUT_S": "0.3"}
    before = {p: p.stat().st_mtime_ns for p in (cwd / "home").rglob("*")}
    t0 = time.perf_counter()
    out = subprocess.run([ARBOR, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - t0
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    assert all(name in lines[0] for name in named), lines[0]
    assert wall < 3.0, f"{wall:.1f} s"
    assert not (cwd / "prefect").exists(), "Prefect was started"
    assert {p: p.stat().st_mtime_ns for p in (cwd / "home").rglob("*") if p in before} == before  # nothing changed
    assert not any("run" in p.name and p.name != "runs" and p not in before for p in (cwd / "home").rglob("*"))


def test_a_question_too_long_for_the_context_is_refused_naming_it(user) -> None:
    """A 1.1 MB question was accepted and the train stage ran for minutes on its 250k-token
    prompt. Only long questions are tokenised, with the policy's tokenizer (the tiny one is built first, so this
    case is not held to the 3 s of the others)."""
    cwd, env = user
    (cwd / "long.jsonl").write_text('{"question": "short?", "answer": "a"}\n'
                                    + json.dumps({"question": "who " * 280_000, "answer": "x"}) + "\n")
    out = subprocess.run([ARBOR, "train", "--set", "data.train=long.jsonl"], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert "question long-2 has a 2802" in lines[0] and "over the 1792 tokens" in lines[0], lines[0]
    assert not (cwd / "prefect").exists()


def test_arbor_home_that_is_a_file_is_refused(user) -> None:
    cwd, env = user
    (cwd / "afile").write_text("x")
    out = subprocess.run([ARBOR, "runs"], cwd=cwd, env={**env, "ARBOR_HOME": str(cwd / "afile")},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"error: ARBOR_HOME={cwd / 'afile'} is a file, not a folder: point ARBOR_HOME at a folder (it is created "
        "if missing)"], out.stderr[-3000:]


def test_validation_imports_neither_prefect_nor_torch(user) -> None:
    """The refusals above come before the flow machinery is imported (what keeps them well under 3 s)."""
    cwd, env = user
    code = (
        "import sys\nfrom arbor.cli import app\n"
        "for args in (['train', '--resume', 'nope'], ['train', '--set', 'train.deepspeed_config=x.json'],\n"
        "             ['train', '--set', 'rollout.k=1'], ['compare', '--methods', 'foo'],\n"
        "             ['rubrics', 'export', 'nope'], ['train', '--resume', 'r1', '--set', 'run.seed=3']):\n"
        "    try:\n        app(args)\n    except SystemExit as e:\n        assert e.code == 2, (args, e.code)\n"
        "print(sorted(m for m in ('prefect', 'torch', 'transformers', 'deepspeed', 'arbor.flows.train') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_resume_extends_a_run_and_records_the_change(tmp_path: Path) -> None:
    from arbor.flows.run_setup import prepare_run, stored_config
    from arbor.storage.runs import run_row

    home = tmp_path / "home"
    first = prepare_run("tiny-cpu", {"run.steps": 2, "rollout.k": 4}, "r1", False, home)
    assert first.run.steps == 2
    cfg = prepare_run("tiny-cpu", {"run.steps": 4, "rollout.k": 4}, "r1", True, home)  # k as stored: no change
    assert cfg.run.steps == 4 and stored_config("r1", home).run.steps == 4
    (change,) = json.loads(run_row("r1", home)["config_changes"])
    assert (change["key"], change["old"], change["new"]) == ("run.steps", 2, 4)
    with pytest.raises(ConfigError, match=r"rollout\.k \(4 -> 8\).*resuming run 'r1'"):
        prepare_run("tiny-cpu", {"rollout.k": 8}, "r1", True, home)
    assert stored_config("r1", home).rollout.k == 4
    with pytest.raises(ValueError, match="cannot resume run 'r2'"):
        prepare_run("tiny-cpu", None, "r2", True, home)


def _statuses(env: dict[str, str], cwd: Path) -> dict[str, str]:
    out = subprocess.run([ARBOR, "runs", "--format", "json"], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["run_id"]: r["status"] for r in json.loads(out.stdout)}


@pytest.mark.slow
def test_train_reports_next_steps_and_runs_tells_running_from_killed(prefect_harness, tmp_path: Path) -> None:
    """A real `arbor train`: a finished run prints where its results are and what to run next; a live run shows
    `running` (and cannot be resumed twice); SIGKILLed, it shows `crashed` at once."""
    from prefect.settings import PREFECT_API_URL

    from arbor.storage.heartbeat import read_owner
    from arbor.storage.runs import run_row

    home = tmp_path / "home"
    env = {**os.environ, "ARBOR_HOME": str(home), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    corpus = tmp_path / "corpus.jsonl"  # a small BM25 index; the relative --set path is read from the cwd
    corpus.write_text("".join(json.dumps({"title": f"Book {i}", "text": f"Book {i} was written by Author {i}."})
                              + "\n" for i in range(20)))
    tiny = [f"--set={s}" for s in ("run.sft_warm_start=false", "rollout.batch_size=2", "rollout.k=2",
                                   "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=16",
                                   "search.corpus=corpus.jsonl")]
    done = subprocess.run([ARBOR, "train", "--run-id", "done", "--set", "run.steps=1", *tiny], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"results: {home}" in done.stdout, done.stdout
    assert "arbor report done" in done.stdout and "where run_id = $run_id" in done.stdout, done.stdout
    assert "--param run_id=done" in done.stdout, done.stdout
    stored = json.loads(run_row("done", home)["config_json"])
    assert stored["search"]["corpus"] == str(corpus)  # stored absolute: a resume from elsewhere reads the same file

    log = tmp_path / "live.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([ARBOR, "train", "--run-id", "live", "--set", "run.steps=50", *tiny], cwd=tmp_path,
                                env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while read_owner("live", home) is None:  # the flow owns the run before it opens engines or trainer
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert read_owner("live", home)["pid"] == proc.pid
        assert _statuses(env, tmp_path) == {"done": "completed", "live": "running"}
        again = subprocess.run([ARBOR, "train", "--resume", "live"], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 2 and "still running" in again.stderr and str(proc.pid) in again.stderr
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9
    assert _statuses(env, tmp_path) == {"done": "completed", "live": "crashed"}


def _processes_with(home: Path) -> set[int]:
    """Live processes whose environment names this workspace (a run, its temporary Prefect server, the watchdog)."""
    mark = f"ARBOR_HOME={home}".encode()
    out = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                out.add(int(entry))
        except OSError:
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the watchdog reads /proc (Linux)")
def test_a_sigkilled_train_leaves_no_temporary_prefect_server_behind(tmp_path: Path) -> None:
    """SIGKILLed, `arbor train` used to leave Prefect's temporary server running under PID 1 for
    minutes. The watchdog it starts stops every process the run had started, within seconds."""
    from arbor.storage.heartbeat import read_owner

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in QUIET}  # no API URL: the run starts its own server
    env.update(ARBOR_HOME=str(home), PREFECT_HOME=str(tmp_path / "prefect"))
    log = tmp_path / "live.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([ARBOR, "train", "--run-id", "live", "--set", "run.steps=50",
                                 "--set", "run.sft_warm_start=false"], cwd=tmp_path, env=env, stdout=fh,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while read_owner("live", home) is None:  # the flow is running, so its API server is up
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        started = _processes_with(home) - {proc.pid}
        assert len(started) >= 2, started  # the temporary server and the watchdog, at least
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30  # a 1 s look, then SIGTERM, and SIGKILL 5 s later for what ignored it
    while (left := _processes_with(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left if Path(f"/proc/{p}").exists()]


def test_a_full_disk_mid_run_ends_in_one_line_and_the_run_resumes(prefect_harness, tmp_path: Path) -> None:
    """A disk that fills during a run ended in a traceback. The OS error a full disk gives a
    writer (injected where step 1's training commits) now ends the run with one last line naming the cause and
    the resume command; the run is marked failed, and the resume finishes it."""
    from prefect.settings import PREFECT_API_URL

    home = tmp_path / "home"
    env = {**os.environ, "ARBOR_HOME": str(home), "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "ARBOR_FAULT": "1:train:enospc"}
    tiny = [f"--set={s}" for s in ("run.steps=1", "run.sft_warm_start=false", "rollout.batch_size=2", "rollout.k=2",
                                   "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=16")]
    full = subprocess.run([ARBOR, "train", "--run-id", "full", *tiny], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert full.returncode == 1, full.stderr[-3000:]
    assert full.stderr.splitlines()[-1] == (
        "error: run full stopped: the disk is full (No space left on device: <injected at step 1, stage train>); "
        f"what was stored is kept: fix that and resume it with `{ARBOR} train --resume full`"), full.stderr[-3000:]
    assert _statuses({**env, "ARBOR_FAULT": ""}, tmp_path) == {"full": "failed"}
    env.pop("ARBOR_FAULT")
    again = subprocess.run([ARBOR, "train", "--resume", "full"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _statuses(env, tmp_path) == {"full": "completed"}
