"""A quiet default: arbor's own lines, not its libraries' chatter; ``--verbose`` brings it back.

What is silenced, and how (each at its source, so nothing of arbor's own is lost):

- weight loading / saving bars (transformers, huggingface_hub): ``HF_HUB_DISABLE_PROGRESS_BARS=1``, read when they
  are imported;
- transformers' advisory warnings: ``TRANSFORMERS_VERBOSITY=error``;
- ``FutureWarning`` / ``DeprecationWarning`` from libraries: warning filters here and ``PYTHONWARNINGS`` for the
  processes a run starts (trainer service, SFT ranks, judge server);
- DeepSpeed's "Setting accelerator to CPU" warning: ``DS_ACCELERATOR=cpu`` when there is no CUDA device (what it
  would pick anyway); its "op built successfully" print, Prefect's temporary-server notice and docs link, and
  Prefect's "Finished in state Completed()" per task run (a failed, crashed or retried one is still logged): a log
  filter on every handler (``NOISE``);
- bm25s' DEBUG index lines, great-expectations' and httpx's INFO lines: their loggers at WARNING (and a filter,
  as bm25s sets DEBUG on import).

``quiet()`` is idempotent and is called by the CLI (unless ``--verbose``), by each flow when it starts (a
deployment's worker has no CLI) and by every rank of a launched process group. ``ARBOR_VERBOSE=1`` (what
``--verbose`` sets, inherited by child processes) turns it off everywhere.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

NOISE = re.compile(
    r"built successfully"  # DeepSpeed's op loader prints it on every process start
    r"|Setting accelerator to CPU"
    r"|(Starting|Stopping) temporary server on|docs\.prefect\.io/v3/concepts/server"  # Prefect's ephemeral server
    r"|Opening Data Docs|for ephemeral docs site"  # great-expectations' data-docs notices
    r"|^Finished in state Completed\(\)$"  # Prefect's line per finished task run: 7 a step, the step summary says it
)
QUIET_LOGGERS = ("bm25s", "great_expectations", "httpx", "httpcore", "sentence_transformers", "urllib3",
                 "torch.distributed.elastic")


class BelowWarning(logging.Filter):
    """Drops a library logger's records below WARNING even when the library sets its own level on import (bm25s
    sets DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


_BELOW_WARNING = BelowWarning()


class NoiseFilter(logging.Filter):
    """Drops the library lines ``NOISE`` matches (printed lines included: Prefect logs a flow's prints)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return NOISE.search(record.getMessage()) is None
        except Exception:  # a record whose message cannot be formatted is not ours to judge
            return True


_FILTER = NoiseFilter()


def verbose() -> bool:
    return os.environ.get("ARBOR_VERBOSE", "") not in ("", "0")


def set_verbose() -> None:
    """``--verbose``: every library line, in this process and the ones it starts."""
    os.environ["ARBOR_VERBOSE"] = "1"


def quiet() -> None:
    """Silence the library noise above (nothing, with ``ARBOR_VERBOSE=1``)."""
    if verbose():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::DeprecationWarning")
    if "DS_ACCELERATOR" not in os.environ and _has_cuda() is False:
        os.environ["DS_ACCELERATOR"] = "cpu"
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    for name in QUIET_LOGGERS:
        lg = logging.getLogger(name)
        lg.setLevel(logging.WARNING)
        if _BELOW_WARNING not in lg.filters:
            lg.addFilter(_BELOW_WARNING)
    filter_handlers()


# the loggers the noise is logged on (a flow's prints are logged on its run's logger); a logger's filters survive
# Prefect's logging set-up, which replaces handlers when it runs
NOISY_LOGGERS = ("prefect", "prefect.flow_runs", "prefect.task_runs", "prefect.server", "prefect.client")


def all_handlers() -> list[logging.Handler]:
    """Every handler configured so far, on the root logger and every named one."""
    # a copy first: another thread (a Prefect or judge client starting up) may add a logger meanwhile, and iterating
    # the live dict then raised "dictionary changed size during iteration"; dict.copy is one C call
    named = logging.Logger.manager.loggerDict.copy()
    loggers = [logging.getLogger(), *(lg for lg in named.values() if isinstance(lg, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers]


def filter_handlers() -> None:
    """Put ``NoiseFilter`` on the loggers the noise comes from and on every handler configured so far."""
    for target in [*(logging.getLogger(n) for n in NOISY_LOGGERS), *all_handlers()]:
        if _FILTER not in target.filters:
            target.addFilter(_FILTER)


def _has_cuda() -> bool | None:
    """Whether torch sees a CUDA device (what DeepSpeed's own detection asks); None before torch is imported (the
    CLI does not pay for importing it: the training entry points call ``quiet()`` again once it is)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
