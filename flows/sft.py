"""``arbor-sft``: the SFT warm start that precedes RL (paper §4.1, App. B.2).

For the tiny CPU policy the data are synthesised from the offline training questions' supporting facts
(think -> search -> real BM25 results -> answer, ``tasks.env.sft_data``); a user's own JSONL in our tag format works the
same way (``--set sft.data=my_sft.jsonl``; docs/sft.md); under ``rollout.protocol=rubricem`` its flat rows are
staged and given reflection rows first (RubricEM's staged start). The checkpoint is content-addressed under
``{ARBOR_HOME}/sft/``: a second run with the same policy, data and SFT settings reuses it instead of training again.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from arbor.config import ArborConfig, load_config
from arbor.config.inputs import workspace_inputs
from arbor.paths import arbor_home, resolve_home_path
from arbor.tasks.env.sources import spec_source


def sft_key(cfg: ArborConfig) -> str:
    """Everything the SFT checkpoint depends on."""
    policy = cfg.policy.model_dump(mode="json", exclude={"tiny_shape"} if cfg.policy.tiny_shape == "5m" else None)
    from arbor.tasks.env.sft_data import reflection_share

    # how many ranks train and how often state is kept do not change what is trained
    sft = cfg.sft.model_dump(mode="json", exclude={"reflections", "guided", "processes", "save_every",
                                                   "dist_timeout_s"})
    # the share the rows get (unset: the protocol's default); 0 keeps old keys
    if share := reflection_share(cfg.sft, cfg.rollout.protocol):
        sft["reflections"] = share
    if cfg.sft.guided:  # guided copies (0 keeps old keys), written with the guidance's tau and retry feedback
        sft["guided"] = {"share": cfg.sft.guided, "tau": cfg.guidance.tau,
                         "retry_feedback": cfg.guidance.retry_feedback}
    parts = {"sft": sft, "policy": policy,
             # require_answers at its default keeps the earlier keys (the added it)
             "data": cfg.data.model_dump(mode="json", exclude={"require_answers"} if cfg.data.require_answers else None),
             # how long a search may stay silent does not change what it returns (the added it)
             "search": cfg.search.model_dump(mode="json", exclude={"stall_s"}), "seed": cfg.run.seed,
             "max_searches": cfg.rollout.max_searches, "micro_batch_tokens": cfg.train.micro_batch_tokens,
             # the micro-batch cut (SFT on the RL trainer's packer re-keyed every start once)
             "packer": "pack_micro_batches"}
    if cfg.rollout.system_prompt:  # SFT tokenises with the run's prompt; unset keeps the earlier keys
        parts["system_prompt"] = cfg.rollout.system_prompt
    if cfg.rollout.protocol != "arbor":  # the rows' tags and the built-in prompt; arbor keeps the earlier keys
        parts["protocol"] = cfg.rollout.protocol
    for spec in (cfg.sft.data, cfg.data.train, cfg.search.corpus):  # a source's key, only when a spec names it
        named = spec.removeprefix("synth:")  # synth:<set> synthesises from <set>
        if (found := spec_source(named)) and found[0].key:
            parts[named.partition(":")[0]] = found[0].key(cfg)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def sft_data_path(cfg: ArborConfig, home: Path, key: str) -> Path:
    """The SFT JSONL of ``gold_data_path``, with Co-ReAct's guided copies of a share of its rows when ``sft.guided``
    is set (``tasks.methods.coreact.sft``): ``data-{key}-guided-{digest}.jsonl``, written once per content of the
    gold rows (a user's file may change under the same name)."""
    if not cfg.sft.guided:
        return gold_data_path(cfg, home, key, home / "sft" / f"data-{key}.jsonl")
    gold_path = gold_data_path(cfg, home, key, home / "sft" / f"data-{key}-gold.jsonl")
    out = home / "sft" / f"data-{key}-guided-{hashlib.sha256(gold_path.read_bytes()).hexdigest()[:12]}.jsonl"
    if out.exists():
        return out
    from arbor.format import get_protocol
    from arbor.tasks.env.sft_data import read_sft_data, write_jsonl
    from arbor.tasks.methods.coreact.sft import guided_sft_rows

    gold = read_sft_data(gold_path)
    guided, figures = guided_sft_rows(gold, cfg.sft.guided, cfg.run.seed, get_protocol(cfg.rollout.protocol),
                                      max(1, cfg.rollout.max_searches), cfg.guidance)
    print(f"SFT: sft.guided={cfg.sft.guided:g}: {figures['rows']:.0f} guided copies of {len(gold)} rows, "
          f"{figures['guided_steps']:.0f} guided steps; the gold action passes its rubric at "
          f"{100 * figures['gold_passes_rubric']:.0f}% of them", flush=True)
    return write_jsonl(gold + guided, out)


def gold_data_path(cfg: ArborConfig, home: Path, key: str, out: Path) -> Path:
    """The gold SFT JSONL (written at ``out`` when built here): a user's file (under a staged protocol: its rows
    staged and given reflection rows, ``tasks.env.sft_data.build_user_sft_data``), data synthesised from a named question split
    (``synth:offline:train``), or a registered source's own data (``<prefix>:<name>``, ``tasks.env.sources``)."""
    spec = cfg.sft.data
    if not spec.startswith("synth:") and (found := spec_source(spec)):
        source, name = found
        if source.sft_data is None:
            from arbor.tasks.env.sft_data import SFTDataError

            raise SFTDataError(f"sft.data {spec!r}: the source {spec.partition(':')[0]!r} serves no SFT data")
        return out if out.exists() else source.sft_data(name, cfg, out, home)
    if not spec.startswith("synth:"):
        path = Path(spec).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"sft.data: {path} does not exist")
        from arbor.format import get_protocol
        from arbor.tasks.env.sft_data import build_user_sft_data, reflection_share

        if not get_protocol(cfg.rollout.protocol).staged and not reflection_share(cfg.sft, cfg.rollout.protocol):
            return path  # trained as it is
        # staged (and with reflection rows) once per file content: the user's file may change under the same name
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        out = home / "sft" / f"data-{key}-{digest}.jsonl"
        if out.exists():
            return out
        return build_user_sft_data(cfg.sft, cfg.rollout.protocol, path, out, seed=cfg.run.seed)
    from arbor.tasks.env.datasets import fields_of, load_questions
    from arbor.tasks.env.sft_data import build_sft_data

    split = spec.removeprefix("synth:")
    if out.exists():
        return out
    if split == "train":  # the run's own training questions (data.train, data.train_size, run.seed)
        questions = load_questions(cfg.data.train, size=cfg.data.train_size, seed=cfg.run.seed, config=cfg,
                                   fields=fields_of(cfg.data))
        questions = questions[: cfg.sft.questions] if cfg.sft.questions else questions
    else:
        questions = load_questions(split if ":" in split else split.replace("-", ":", 1))  # offline-train ok
    return build_sft_data(cfg, out, home=home, questions=questions, seed=cfg.run.seed)


def sft_checkpoint(cfg: ArborConfig, home: Path) -> Path:
    """The SFT'd policy for ``cfg`` (trained once, then reused); an HF checkpoint directory."""
    from arbor.tasks.env.policy import policy_source
    from arbor.tasks.env.sft_data import SFTDataError, reflection_share, reflection_warning
    from arbor.tasks.training.sft import SFTProgress, launches_process_group, run_sft

    key = sft_key(cfg)
    out = resolve_home_path(cfg.sft.output) if cfg.sft.output else home / "sft" / f"{cfg.run.profile}-{key}"
    if (done := out / "arbor_sft.json").exists():
        made = json.loads(done.read_text())
        # a fixed sft.output (the qwen3 profiles') may hold the start of another protocol: a flat start scores 0 in
        # every RubricEM stage, so it is refused, not reused (checkpoints before this field: arbor's tags)
        if (made_in := made.get("protocol", "arbor")) != cfg.rollout.protocol:
            raise SFTDataError(
                f"sft.output {out} holds an SFT start in protocol {made_in!r}, but rollout.protocol="
                f"{cfg.rollout.protocol}; set sft.output (and run.start_checkpoint) to another directory, e.g. "
                "sft/qwen3-8b-rubricem for RubricEM's staged start (docs/sft.md)")
        if made.get("key") != key:
            print(f"SFT: reusing {out} (sft.output), trained with other settings (key {made.get('key')}, this "
                  f"config's {key})", flush=True)
        return out
    if warning := reflection_warning(cfg.run.method, cfg.sft, cfg.rollout.protocol):
        print(f"WARNING: {warning}", flush=True)
    base = Path(policy_source(cfg.policy, home))
    data = sft_data_path(cfg, home, key)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # the resumable state of this SFT (its key: the same settings and data), kept until the checkpoint is in place
    state = home / "sft" / f".state-{key}"
    state.mkdir(parents=True, exist_ok=True)
    if not launches_process_group(cfg):
        progress = SFTProgress(cfg.sft.epochs)
        try:
            summary = run_sft(cfg, base, data, tmp, home=home, log=progress, state_dir=state)
        finally:
            progress.close()
    else:
        summary = launch_sft(cfg, base, data, tmp, state, home)
    share = reflection_share(cfg.sft, cfg.rollout.protocol)
    (tmp / "arbor_sft.json").write_text(json.dumps({"key": key, "data": str(data), "protocol": cfg.rollout.protocol,
                                                    "reflections": share, **_jsonable(summary)}, indent=1))
    try:
        os.replace(tmp, out)  # atomic: a crash never leaves a checkpoint that looks complete
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    shutil.rmtree(state, ignore_errors=True)  # the checkpoint is in place: nothing left to resume
    return out


class SFTLaunchError(RuntimeError):
    """The launched SFT process group failed (its log's tail is in the message)."""


def launch_sft(cfg: ArborConfig, base: Path, data: Path, out: Path, state: Path, home: Path) -> dict[str, Any]:
    """Run the SFT as a process group (``tasks.training.sft.launch_command``: deepspeed over the node's GPUs, or
    torchrun's gloo ranks on CPU), its rank-0 lines relayed here; the summary rank 0 wrote."""
    from arbor.tasks.training.sft import launch_command

    config, summary = state / "config.json", state / "summary.json"
    config.write_text(cfg.to_json())
    summary.unlink(missing_ok=True)
    cmd = launch_command(cfg, ["--config", str(config), "--model", str(base), "--data", str(data), "--out",
                               str(out), "--state", str(state), "--summary", str(summary), "--home", str(home)])
    assert cmd is not None
    print(f"SFT: launching {' '.join(cmd[:cmd.index('--config')])}", flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with open(state / "launch.log", "a") as log, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip())
                if line.startswith("SFT"):  # rank 0's progress and resume lines
                    print(line.rstrip(), flush=True)
            code = proc.wait()
        except BaseException:  # asked to stop: the group is in a session of its own, stop it here
            stop_group(proc)
            raise
    if code != 0 or not summary.exists():
        dead = dead_rank("\n".join(tail))
        what = dead or f"the SFT process group exited with status {code}"
        message = (f"{what} (log: {state / 'launch.log'}); run arbor-sft again to resume from its last kept state. "
                   "Last lines:\n" + "\n".join(tail))
        from arbor.runtime import stop

        if dead and stop.installed():  # under `arbor train`: one line naming the rank, the run failed, resumable
            print(message, flush=True)
            raise stop.RunStopped(dead, signalled=False, code=1)
        raise SFTLaunchError(message)
    return json.loads(summary.read_text())


def dead_rank(output: str) -> str | None:
    """The rank whose exit ended a launch, from torchrun's failure report ("Root Cause (first observed failure)":
    ``rank : 1 (local_rank: 1)``, ``exitcode : -9 (pid: 123)``); None when the output holds no such report (the
    deepspeed launcher's, a launch that failed before its ranks started). torchrun stops the other ranks itself
    as soon as one exits (it looks every 0.1 s)."""
    import re

    _, found, rest = output.partition("Root Cause (first observed failure)")
    m = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", rest, re.S) if found else None
    return f"SFT rank {m[1]} (pid {m[3]}) exited with status {m[2]}" if m else None


def stop_group(proc: subprocess.Popen[str], grace_s: float = 3.0) -> None:
    """SIGTERM the launched group (its session: the launcher and every rank), SIGKILL it after ``grace_s``."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, int | float | str | bool) or v is None else str(v)) for k, v in d.items()}


@flow(name="arbor-sft", log_prints=True)
def arbor_sft(profile: str = "tiny-cpu", overrides: dict[str, Any] | None = None) -> str:
    """Run (or reuse) the SFT warm start of a profile; returns the checkpoint directory."""
    from arbor.runtime.quiet import quiet

    quiet()  # a worker's flow run has no CLI to do it
    cfg = load_config(profile, overrides)
    workspace_inputs(cfg)  # relative input paths: the current directory's, else ARBOR_HOME's
    out = sft_checkpoint(cfg, arbor_home())
    get_run_logger().info("SFT checkpoint: %s", out)
    return str(out)
