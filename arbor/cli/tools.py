"""The commands that start no run: ``config show``, ``judge serve`` and ``sft convert``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from arbor.cli.common import _fail, _overrides


def config_show_cmd(
    profile: Annotated[str, typer.Option("--profile", "-p", help="configs/<profile>.yaml or a YAML path")] = "tiny-cpu",
    sets: Annotated[list[str] | None, typer.Option("--set", help="override any config value: section.key=value")] = None,
    args: Annotated[list[str] | None, typer.Argument(help="key=value overrides, the same as --set",
                                                     show_default=False)] = None,
) -> None:
    """Print the resolved config as YAML, each value marked default, profile or override (what a run with the
    same arguments writes to ARBOR_HOME/runs/<run_id>/config.yaml)."""
    from arbor.config import ConfigError, load_config
    from arbor.config.show import config_sources, render_config

    overrides = _overrides([*(sets or []), *(args or [])])
    try:
        cfg = load_config(profile, overrides)
        typer.echo(render_config(cfg, config_sources(profile, overrides)), nl=False)
    except ConfigError as e:
        _fail(e)


JUDGE_PYTHON = ".venv-judge/bin/python"  # made by `make judge-env`, under the project root


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def judge_serve_cmd(
    model: Annotated[str, typer.Option(help="'smollm2' (the shipped SmolLM2-135M-Instruct) or a .gguf path")] = "smollm2",
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8090,
    python: Annotated[Path | None, typer.Option(help="a Python with llama-cpp-python[server] (default: the "
                                                "project's .venv-judge, made by make judge-env)")] = None,
    threads: Annotated[int, typer.Option(help="llama.cpp threads (leave cores to the policy)")] = 1,
    n_ctx: Annotated[int, typer.Option("--n-ctx", help="the judge's context in tokens")] = 8192,
    startup_timeout: Annotated[float, typer.Option(help="seconds to wait for /v1/models")] = 120.0,
) -> None:
    """Serve a real judge on this machine, offline, until Ctrl-C: prints the `--set judge.*` to point a run at it."""
    import signal
    import subprocess

    from arbor.paths import PROJECT_ROOT, arbor_home
    from arbor.tasks.env.policy import PolicyLoadError, shipped_gguf
    from arbor.tasks.env.serving import ServerDied, Supervised, llama_judge_spec, served_gguf

    exe = python.expanduser().absolute() if python is not None else PROJECT_ROOT / JUDGE_PYTHON
    if not exe.is_file():
        _fail(f"--python {exe}: not found; `make judge-env` builds llama.cpp's server into .venv-judge")
    probe = subprocess.run([str(exe), "-c", "import llama_cpp.server"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        _fail(f"--python {exe}: cannot import llama_cpp.server ({last}); `make judge-env` installs it")
    from arbor.config.rollout import SHIPPED_GGUF

    if not model.endswith(".gguf") and model not in SHIPPED_GGUF:
        _fail(f"--model {model}: neither a shipped model ({', '.join(SHIPPED_GGUF)}) nor a .gguf file")
    try:
        gguf = shipped_gguf(model) if not model.endswith(".gguf") else Path(model).expanduser().resolve()
    except PolicyLoadError as e:
        _fail(f"--model {model}: {e}")
    if not gguf.is_file():
        _fail(f"--model {model}: no such file")
    alias = gguf.stem
    if not model.endswith(".gguf"):  # the shipped Q4_1, served as Q8_0 (converted once into the workspace)
        alias = model
        try:
            gguf = served_gguf(str(exe), gguf, arbor_home())
        except RuntimeError as e:
            _fail(f"--model {model}: {e}")
    spec = llama_judge_spec(str(exe), gguf, port=port, alias=alias, n_ctx=n_ctx, threads=threads)
    server = Supervised(spec, startup_timeout_s=startup_timeout, max_restarts=0)
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's stop is a clean stop too
    try:
        server.start()
        typer.echo(f"judge ready: --set judge.backend=openai --set judge.base_url={spec.base_url} "
                   f"--set judge.model={alias} --set judge.context_tokens={n_ctx} "
                   "(judge.api_key_env: any variable set to any value)", err=True)
        code = server.proc.wait() if server.proc is not None else None
        _fail(f"the judge server exited with {code}")
    except (ServerDied, TimeoutError) as e:
        _fail(f"judge server: {e}")
    except KeyboardInterrupt:
        typer.echo("stopping the judge server", err=True)
    finally:
        server.stop()


def sft_convert_cmd(
    sources: Annotated[list[Path], typer.Argument(help="Tool-Star-SFT-54K's JSON (alpaca layout) or conversation "
                                                       "files (.json, .jsonl, .parquet)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="the SFT JSONL to write (sft.data)")],
    protocol: Annotated[str, typer.Option(help="arbor | search-r1 | rubricem: the tags the rows are written in")] = "arbor",
    limit: Annotated[int | None, typer.Option(help="stop after this many kept rows")] = None,
) -> None:
    """Convert the paper's SFT sources to arbor's SFT rows: search-only trajectories, tags mapped, each row
    format-checked; prints what was kept and why the rest was dropped (docs/sft.md)."""
    from arbor.format import PROTOCOLS
    from arbor.tasks.env.sft_convert import ConvertError, convert_file
    from arbor.tasks.env.sft_data import write_jsonl

    if protocol not in PROTOCOLS:
        _fail(f"--protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if out.exists():
        _fail(f"--out {out} already exists: choose a new file")
    try:
        report = convert_file(list(sources), protocol, limit)
    except ConvertError as e:
        _fail(e)
    if not report.rows:
        _fail(f"no row could be converted:\n{report.message()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(report.rows, out)
    typer.echo(report.message())
    typer.echo(f"wrote {len(report.rows)} rows to {out} (--set sft.data={out})")
