"""The stop drill. `arbor train` is asked to stop as users and supervisors ask — SIGINT (a terminal's
Ctrl-C) and SIGTERM (`timeout`, SLURM's `scancel`), each sent to the process alone or to its whole process group,
every (signal, target) pair met at start-up and in a phase that stores (SQUARE), and it loses what it depends on
mid-run: Prefect's temporary API server, the judge server, an SFT rank, and a judge that reads every request and never answers. Every case must
end within 15 s of the signal with one last line naming what stopped the run and how to go on, the run recorded
as stopped (failed for the dead server), and no process of the run left behind; a stopped run resumes to exactly
the result of a run that was never stopped.

Every run is a real `.venv/bin/arbor train` in a session of its own (as a terminal's foreground job is). The cases
about Prefect's temporary server (the start-up table, the server's death, `arbor demo`) run with no PREFECT_API_URL,
so each starts its own — the server a group signal used to kill; the others name a running server (``served``), as
a user with `prefect server start` does. Phases are reached by waiting for the run's own progress lines or its
processes, never by sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                                   reason="the drill reads /proc (Linux)")]

ARBOR = str(Path(sys.executable).parent / "arbor")
BOUND_S = 15.0
TINY = ("run.steps=1", "rollout.batch_size=2", "rollout.k=2", "rollout.max_turns=2",
        "rollout.max_new_tokens_per_turn=16", "search.corpus=corpus.jsonl", "checkpoint.every=1")
NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}
TABLE: list[tuple[str, float, str, str | None, str]] = []  # (case, seconds, last line, status, resume), printed


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """One workspace and Prefect home for every case (the tiny policy, BM25 index and SFT data are built once); a
    20-passage corpus; progress lines every 0.2 s."""
    root = tmp_path_factory.mktemp("drill")
    (root / "corpus.jsonl").write_text("".join(
        json.dumps({"title": f"Book {i}", "text": f"Book {i} was written by Author {i}."}) + "\n" for i in range(20)))
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ARBOR_FAULT", "ARBOR_SFT_FAULT")}
    env.update(ARBOR_HOME=str(root / "home"), PREFECT_HOME=str(root / "prefect"), ARBOR_PROGRESS_SECONDS="0.2",
               PREFECT_LOGGING_LEVEL="INFO")  # SFT's progress lines are the flow's log lines
    yield root, env
    print("\n| case | s to exit | last line | status | resume |\n|---|---|---|---|---|")
    for case, secs, line, status, resume in TABLE:
        print(f"| {case} | {secs:.1f} | {line} | {status} | {resume} |")


@pytest.fixture(scope="module")
def served(drill, prefect_harness) -> tuple[Path, dict[str, str]]:
    """The drill's workspace with this worker's Prefect server named in ``PREFECT_API_URL``, as a user who runs
    ``prefect server start`` has it: a run then starts no temporary server of its own (about 10 CPU-s a run). The
    cases about the temporary server (every start-up case, its death mid-run, ``arbor demo``) run without one
    (``drill``); the others stop a run that uses the configured server."""
    from prefect.settings import get_current_settings

    root, env = drill
    url = get_current_settings().api.url
    assert url, "prefect_harness configures an API"
    return root, {**env, "PREFECT_API_URL": url}


LIVE: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_case():
    """A case that failed before its run ended: its session is killed (the next case must not share the cores)."""
    yield
    while LIVE:
        proc = LIVE.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Run:
    """A live `arbor train` in its own session; its output (stdout and stderr) collected line by line."""

    def __init__(self, root: Path, env: dict[str, str], case: str, args: list[str], command: str = "train") -> None:
        self.mark = f"ARBOR_DRILL_CASE={case}"
        self.lines: list[str] = []
        self.proc = subprocess.Popen([ARBOR, command, *args], cwd=root, env={**env, "ARBOR_DRILL_CASE": case},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        LIVE.append(self.proc)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def tail(self) -> str:
        return "\n".join(self.lines[-40:])

    def wait_for(self, ready: Callable[[], bool], what: str, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {what}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s:\n{self.tail()}"
            time.sleep(0.05)

    def printed(self, text: str) -> Callable[[], bool]:
        return lambda: any(text in line for line in self.lines)

    def processes(self) -> dict[int, bytes]:
        """The live processes of this case ({pid: command line}): the run, its servers, its watchdog."""
        out: dict[int, bytes] = {}
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and self.mark.encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                pass
        return out

    def rank(self, rank: int) -> int | None:
        """The pid of rank ``rank`` of the run's launched SFT group, once it was started."""
        for pid, cmd in self.processes().items():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"arbor.tasks.training.sft" in cmd and f"RANK={rank}".encode() in environ:
                return pid
        return None

    def api_server(self) -> int | None:
        """The pid of the run's temporary Prefect API server, once it was started."""
        return next((pid for pid, cmd in self.processes().items() if b"prefect.server.api.server" in cmd), None)

    def finish(self) -> tuple[float, str]:
        """Seconds from now to the run's exit, and its last line; then no process of the case may remain."""
        t0 = time.monotonic()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            pytest.fail(f"still running 60 s after the stop:\n{self.tail()}")
        secs = time.monotonic() - t0
        self._reader.join(timeout=10)
        deadline = time.monotonic() + 10  # the watchdog looks every second
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, left
        return secs, (self.lines or [""])[-1]


def _status(home: Path, run_id: str) -> str | None:
    from arbor.storage.heartbeat import run_status_table

    rows = run_status_table(home).to_pylist()
    return next((r["status"] for r in rows if r["run_id"] == run_id), None)


@dataclass(frozen=True)
class Phase:
    name: str
    sets: tuple[str, ...]
    reached: Callable[[Run], Callable[[], bool]]
    stores: bool  # the run's row exists once the phase is reached


PHASES = {
    "start-up": Phase("start-up", ("run.sft_warm_start=false",),  # the temporary server is starting
                      lambda r: lambda: r.api_server() is not None, stores=False),
    "sft": Phase("sft", (), lambda r: r.printed("SFT update"), stores=True),
    "rollout": Phase("rollout", ("run.sft_warm_start=false",), lambda r: r.printed("· rollout ·"), stores=True),
    "train": Phase("train", ("run.sft_warm_start=false",), lambda r: r.printed("· train ·"), stores=True),
}
# every (signal, target) pair is met at start-up (the whole table: 1-2 s a case) and in a phase that stores: one
# pair in each of the three phases that run (15-30 s a case), the fourth (a group SIGINT in training) by the resume
# case below; a group SIGTERM also stops a checkpoint save (below)
SQUARE = {"sft": ((signal.SIGINT, False),),
          "rollout": ((signal.SIGTERM, True),),
          "train": ((signal.SIGTERM, False),)}
CASES = [(phase, sig, group) for phase in PHASES
         for sig, group in SQUARE.get(phase, [(s, g) for s in (signal.SIGINT, signal.SIGTERM) for g in (False, True)])]


def _case_id(phase: str, sig: int, group: bool) -> str:
    return f"{phase}-{signal.Signals(sig).name}-{'group' if group else 'process'}"


def _expected(run_id: str, sig: int, stores: bool) -> str:
    why = f"by {NAMES[sig]}"
    if not stores:
        return f"stopped: the run stopped {why} before it stored anything; start it again with the same command"
    return f"stopped: run {run_id} stopped {why}; what was stored is kept: resume it with `{ARBOR} train --resume {run_id}`"


@pytest.mark.parametrize(("phase", "sig", "group"), CASES, ids=[_case_id(*c) for c in CASES])
def test_a_signal_stops_the_run_in_seconds(drill, served, phase: str, sig: int, group: bool) -> None:
    root, env = drill if phase == "start-up" else served
    case = _case_id(phase, sig, group)
    run_id = case.lower()
    p = PHASES[phase]
    run = Run(root, env, case, ["--run-id", run_id, *[f"--set={s}" for s in (*TINY, *p.sets)]])
    run.wait_for(p.reached(run), phase)
    (os.killpg if group else os.kill)(run.proc.pid, sig)
    secs, last = run.finish()
    status = _status(root / "home", run_id)
    TABLE.append((case, secs, last, status, "-"))
    assert last == _expected(run_id, sig, p.stores), run.tail()
    assert run.proc.returncode == 128 + sig, run.tail()
    assert status == ("stopped" if p.stores else None)
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"


def test_a_dead_prefect_server_ends_the_run_naming_it(drill) -> None:
    """Prefect's temporary server SIGKILLed mid-rollout: the run ends in seconds naming it (it used to wait minutes
    on the dead API), marked failed, with the resume command."""
    root, env = drill
    run = Run(root, env, "api-killed", ["--run-id", "api-killed", *[f"--set={s}" for s in TINY],
                                        "--set=run.sft_warm_start=false"])
    run.wait_for(run.printed("· rollout ·"), "rollout")
    server = run.api_server()
    assert server is not None
    os.kill(server, signal.SIGKILL)
    secs, last = run.finish()
    status = _status(root / "home", "api-killed")
    TABLE.append(("api-server SIGKILL in rollout", secs, last, status, "-"))
    assert last == (f"error: run api-killed stopped because Prefect's API server (pid {server}) exited with status "
                    f"-9; what was stored is kept: resume it with `{ARBOR} train --resume api-killed`"), run.tail()
    assert run.proc.returncode == 1 and status == "failed"
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"


def _result(home: Path, run_id: str) -> tuple[list[tuple], list[tuple], dict[str, bytes]]:
    """What a run computed: its trajectories, its steps' update metrics and its final policy's weights."""
    from safetensors.torch import load_file

    from arbor.storage.parquet import read_table

    trajs = sorted((r["step"], r["group"], r["sample"], r["text"], tuple(r["response_ids"]),
                    tuple(r["rollout_logprobs"]), r["shaped_reward"])
                   for r in read_table("trajectories", run_id=run_id, home=home).to_pylist())
    steps = sorted((r["step"], r["loss"], r["grad_norm"], r["approx_kl"], r["entropy"])
                   for r in read_table("steps", run_id=run_id, home=home).to_pylist())
    [weights] = (home / "checkpoints" / run_id / "step_000001" / "hf").glob("*.safetensors")
    return trajs, steps, {k: v.numpy().tobytes() for k, v in load_file(weights).items()}


_REFERENCE: dict[Path, tuple] = {}


def _reference(root: Path, env: dict[str, str]) -> tuple:
    """The result of the drill's run never stopped (TINY, no SFT), run once for the cases that resume."""
    if root not in _REFERENCE:
        ref = Run(root, env, "ref", ["--run-id", "never-stopped", *[f"--set={s}" for s in (*TINY, "run.sft_warm_start=false")]])
        ref.wait_for(lambda: ref.proc.poll() is not None, "the reference run's end", timeout_s=300)
        assert ref.proc.returncode == 0, ref.tail()
        _REFERENCE[root] = _result(root / "home", "never-stopped")
    return _REFERENCE[root]


def test_a_run_stopped_by_a_group_ctrl_c_in_training_resumes_exactly(served) -> None:
    """The representative case: Ctrl-C to the whole group while step 1 trains, then `arbor train --resume`; the
    trajectories, the update's metrics and the final weights equal those of a run never stopped."""
    root, env = served
    home = root / "home"
    sets = [f"--set={s}" for s in (*TINY, "run.sft_warm_start=false")]
    run = Run(root, env, "resume", ["--run-id", "stopped", *sets])
    run.wait_for(run.printed("· train ·"), "train")
    os.killpg(run.proc.pid, signal.SIGINT)
    secs, last = run.finish()
    assert last == _expected("stopped", signal.SIGINT, True) and _status(home, "stopped") == "stopped", run.tail()
    again = Run(root, env, "resume", ["--resume", "stopped"])
    again.wait_for(lambda: again.proc.poll() is not None, "the resumed run's end", timeout_s=300)
    assert again.proc.returncode == 0, again.tail()
    same = _result(home, "stopped") == _reference(root, env)
    TABLE.append(("train-SIGINT-group, then --resume", secs, last, _status(home, "stopped"), str(same)))
    assert _status(home, "stopped") == "completed"
    assert same


# ------------------------------------------------------------------------------ a signal in each phase of a run
def _stop_in(root: Path, env: dict[str, str], case: str, sets: tuple[str, ...], reached: str,
             sig: int = signal.SIGINT, command: str = "train", args: tuple[str, ...] = ()) -> tuple[Run, float, str]:
    """A run (``command``) with ``sets`` stopped by ``sig`` to its whole group once it printed ``reached``."""
    args = ("--run-id", case) if command == "train" else args
    run = Run(root, env, case, [*args, *[f"--set={s}" for s in sets]], command=command)
    run.wait_for(run.printed(reached), reached)
    os.killpg(run.proc.pid, sig)
    secs, last = run.finish()
    return run, secs, last


def test_a_signal_while_checkpointing_stops_the_run_and_it_resumes_exactly(served) -> None:
    """SIGTERM to the group while the run writes step 1's checkpoint (the run's last step: the final policy):
    stopped in seconds, the half-written save left uncommitted, then `--resume` ends with the trajectories, metrics
    and weights of a run never stopped. The tiny policy's save takes about as long as one progress line (0.2 s), so
    the run holds inside it, after the DeepSpeed state and before the HF export and the commit, until the signal
    comes (``ARBOR_FAULT=1:checkpoint:hold-mid``): the signal lands inside the save every time (it used to land
    after it, or the run to end before its checkpoint line was printed)."""
    root, env = served
    home = root / "home"
    case = "checkpoint-sigterm-group"
    run, secs, last = _stop_in(root, {**env, "ARBOR_FAULT": "1:checkpoint:hold-mid"}, case,
                               (*TINY, "run.sft_warm_start=false"), "· checkpoint ·", signal.SIGTERM)
    ckpts = home / "checkpoints" / case
    inside = not (ckpts / "step_000001").exists() and (ckpts / "step_000001.tmp").is_dir()
    status = _status(home, case)
    assert inside, sorted(p.name for p in ckpts.iterdir())
    assert last == _expected(case, signal.SIGTERM, True), run.tail()
    assert run.proc.returncode == 128 + signal.SIGTERM and status == "stopped", run.tail()
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"
    again = Run(root, env, case, ["--resume", case])
    again.wait_for(lambda: again.proc.poll() is not None, "the resumed run's end", timeout_s=300)
    assert again.proc.returncode == 0, again.tail()
    same = _result(home, case) == _reference(root, env)
    TABLE.append(("checkpoint-SIGTERM-group (inside the save), then --resume", secs, last, status, str(same)))
    assert _status(home, case) == "completed" and same


def test_a_signal_during_evaluation_stops_the_run(served) -> None:
    """SIGINT to the group while the run evaluates its starting policy (run.eval_every with eval_at_start)."""
    root, env = served
    case = "eval-sigint-group"
    run, secs, last = _stop_in(root, env, case, (*TINY, "run.sft_warm_start=false", "run.eval_every=1",
                                                 "run.eval_size=2", "run.eval_runs=1"), "· eval ·")
    status = _status(root / "home", case)
    TABLE.append(("eval-SIGINT-group", secs, last, status, "-"))
    assert last == _expected(case, signal.SIGINT, True), run.tail()
    assert run.proc.returncode == 128 + signal.SIGINT and status == "stopped"
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"


def test_arbor_demo_takes_the_same_stop_path(drill) -> None:
    """`arbor demo` (another command that trains) stopped by a group SIGINT mid-rollout: the same line, naming the
    run it generated and how to resume it, the run marked stopped (it used to wait on Prefect's killed server)."""
    import re

    root, env = drill
    run, secs, last = _stop_in(root, env, "demo-sigint-group", (*TINY, "run.sft_warm_start=false"), "· rollout ·",
                               command="demo", args=("--profile", "tiny-cpu"))
    m = re.fullmatch(r"stopped: run (\S+) stopped by SIGINT \(Ctrl-C\); what was stored is kept: resume it with "
                     r"`(\S+) train --resume (\S+)`", last)
    status = _status(root / "home", m[1]) if m else None
    TABLE.append(("demo: rollout-SIGINT-group", secs, last, status, "-"))
    assert m and m[1] == m[3] and m[2] == ARBOR, run.tail()
    assert run.proc.returncode == 128 + signal.SIGINT and status == "stopped"
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"


def _running(home: Path, known: set[str]) -> Callable[[], str | None]:
    """The id of a run not in ``known`` whose status is ``running`` (its status row is the progress waited on)."""
    from arbor.storage.heartbeat import run_status_table

    def find() -> str | None:
        try:
            rows = run_status_table(home).to_pylist()
        except Exception:  # noqa: BLE001 - the workspace's first files are being written
            return None
        return next((r["run_id"] for r in rows if r["run_id"] not in known and r["status"] == "running"), None)

    return find


def _known(home: Path) -> set[str]:
    """The ids of the runs ``home`` holds (none yet: an empty set)."""
    from arbor.storage.heartbeat import run_status_table

    try:
        return {r["run_id"] for r in run_status_table(home).to_pylist()}
    except Exception:  # noqa: BLE001 - a workspace with no run yet has no tables to read
        return set()


@pytest.mark.parametrize("command", ["eval", "guidance-train"])
def test_eval_and_guidance_train_record_stopped(served, command: str) -> None:
    """`arbor eval` and `arbor guidance-train`, stopped by a group SIGINT while they run, record
    their run as ``stopped`` as `arbor train` does (they recorded no status: `arbor runs` said running, then
    crashed)."""
    root, env = served
    home = root / "home"
    known = _known(home)
    case = f"{command}-sigint-group"
    # guidance-train branches 16 questions, so the signal lands in its work: with 2 it once reached its end (no
    # ranking to train on) before the signal did, under the suite's load
    args = (["--profile", "tiny-cpu", "--split", "bamboogle", "--limit", "4", "--runs", "2"] if command == "eval" else
            ["--profile", "tiny-cpu", "--run-id", case, "--set=run.sft_warm_start=false",
             "--set=guidance.branch_questions=16"])
    run = Run(root, env, case, args, command=command)
    found = _running(home, known)
    run.wait_for(lambda: found() is not None, "its run recorded as running")
    rid = found()
    os.killpg(run.proc.pid, signal.SIGINT)
    secs, last = run.finish()
    status = _status(home, rid)
    TABLE.append((f"{command}: SIGINT-group while running", secs, last, status, "-"))
    if command == "eval":
        assert last == ("stopped: the evaluation stopped by SIGINT (Ctrl-C); nothing of it is kept: start it again "
                        "with the same command"), run.tail()
    else:
        assert last == (f"stopped: run {case} stopped by SIGINT (Ctrl-C); what was stored is kept: resume it with "
                        f"`{ARBOR} guidance-train --run-id {case}`"), run.tail()
    assert run.proc.returncode == 128 + signal.SIGINT and status == "stopped", run.tail()
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"


JUDGE_PYTHON = Path(__file__).resolve().parent.parent / ".venv-judge" / "bin" / "python"


def test_a_dead_judge_server_ends_the_run_naming_it(served) -> None:
    """The judge (llama.cpp's server on the shipped SmolLM2, as `arbor judge serve` runs it) SIGKILLed mid-run: the
    run stops once the server has refused connections for 2 s (arbor.runtime.liveness), naming it, marked failed. Bound:
    2 s to call it dead + up to 3 s for the main thread to unwind (DEAD_DEPENDENCY_GRACE_S) + the exit."""
    import dataclasses
    import socket

    from arbor.tasks.env.policy import shipped_gguf
    from arbor.tasks.env.serving import Supervised, llama_judge_spec, served_gguf

    if not JUDGE_PYTHON.is_file():
        pytest.fail(f"{JUDGE_PYTHON} not found: `make judge-env` builds llama.cpp's server (`make test` does)")
    root, env = served
    case = "judge-killed"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gguf = served_gguf(str(JUDGE_PYTHON), shipped_gguf("smollm2"), root)  # as `arbor judge serve` serves it
    spec = llama_judge_spec(str(JUDGE_PYTHON), gguf, port=port, alias="smollm2", n_ctx=2048)
    spec = dataclasses.replace(spec, env={**spec.env, "ARBOR_DRILL_CASE": case})  # the case's mark
    server = Supervised(spec, startup_timeout_s=180, max_restarts=0, log_path=str(root / "judge.log"))
    server.start()
    try:
        judge = ("judge.backend=openai", f"judge.base_url={spec.base_url}", "judge.model=smollm2",
                 "judge.api_key_env=ARBOR_DRILL_JUDGE_KEY", "judge.context_tokens=2048", "judge.max_judge_tokens=384",
                 "judge.concurrency=1")
        run = Run(root, {**env, "ARBOR_DRILL_JUDGE_KEY": "local"}, case,
                  ["--run-id", case, *[f"--set={s}" for s in (*TINY, "run.sft_warm_start=false", *judge)]])
        run.wait_for(run.printed("· rollout ·"), "rollout")
        assert server.proc is not None
        pid = server.proc.pid
        server.proc.kill()
        secs, last = run.finish()
    finally:
        server.stop()
    status = _status(root / "home", case)
    TABLE.append(("judge server SIGKILL in rollout", secs, last, status, "-"))
    assert last == (f"error: run {case} stopped because the judge server at http://127.0.0.1:{port}/v1 stopped "
                    f"accepting connections (connection refused for 2 s); what was stored is kept: resume it with "
                    f"`{ARBOR} train --resume {case}`"), (pid, run.tail())
    assert run.proc.returncode == 1 and status == "failed"
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"


def test_a_dead_gloo_rank_ends_the_sft_launch_naming_it(served) -> None:
    """One rank of a two-rank gloo SFT (torchrun) SIGKILLed while the SFT trains: torchrun stops the other rank,
    the run ends naming the dead rank and its status, marked failed, resumable."""
    root, env = served
    case = "sft-rank-killed"
    run = Run(root, env, case, ["--run-id", case, *[f"--set={s}" for s in (*TINY, "sft.processes=2")]])
    run.wait_for(run.printed("SFT update"), "the launched SFT's first update")
    pid = run.rank(1)
    assert pid is not None, run.processes()
    os.kill(pid, signal.SIGKILL)
    secs, last = run.finish()
    status = _status(root / "home", case)
    TABLE.append(("gloo rank 1 SIGKILL in a two-rank SFT", secs, last, status, "-"))
    assert last == (f"error: run {case} stopped because SFT rank 1 (pid {pid}) exited with status -9; what was "
                    f"stored is kept: resume it with `{ARBOR} train --resume {case}`"), run.tail()
    assert run.proc.returncode == 1 and status == "failed"
    assert secs < BOUND_S, f"{secs:.1f} s\n{run.tail()}"


def test_a_silent_judge_ends_the_run_naming_it_and_it_resumes(served) -> None:
    """A judge that reads every request and never answers (tests/raw_server.py, a real TCP server on
    loopback). Its first call stalls past judge.stall_s = 1 s: the run ends naming the role and the URL, marked
    failed, within the stall bound plus BOUND_S of the first request; resumed against a working
    judge, it completes from what it stored."""
    from openai_server import OpenAIServer
    from raw_server import RawServer

    root, env = served
    case = "judge-silent"
    env = {**env, "ARBOR_DRILL_JUDGE_KEY": "sk-drill-secret-0123456789"}
    judge = ("run.method=rar", "run.sft_warm_start=false", "judge.backend=openai", "judge.model=test-judge",
             "judge.api_key_env=ARBOR_DRILL_JUDGE_KEY", "judge.timeout_s=1", "judge.max_retries=0", "judge.stall_s=1")
    with RawServer("silent") as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        run = Run(root, env, case, ["--run-id", case, *[f"--set={s}" for s in (*TINY, *judge)],
                                    f"--set=judge.base_url={url}"])
        run.wait_for(lambda: server.first_at is not None, "the judge's first request")
        secs, last = run.finish()
        asked = server.first_at
    status = _status(root / "home", case)
    assert last.startswith(f"error: run {case} stopped: DependencyStalled: the judge of role 'rar_rubrics' at "
                           f"http://127.0.0.1:{server.port}/v1 stalled: no bytes for 1 s;"), run.tail()
    assert f"arbor train --resume {case}" in last, last
    assert "sk-drill-secret" not in run.tail()
    assert run.proc.returncode == 1 and status == "failed"
    assert asked is not None and secs < 1 + BOUND_S, f"{secs:.1f} s\n{run.tail()}"
    with OpenAIServer() as ok:
        resumed = Run(root, env, case, ["--resume", case, f"--set=judge.base_url={ok.base_url}"])
        resumed.proc.wait(timeout=300)
        resumed.finish()
    after = _status(root / "home", case)
    TABLE.append(("judge reads and never answers (stall 1 s)", secs, last, status, after))
    assert resumed.proc.returncode == 0 and after == "completed", resumed.tail()
