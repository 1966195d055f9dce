"""ARBOR (the paper) as a package: the method (``method.py``: its stage graph and decisions), the rubric memory
(``memory.py``: one class, ``RubricMemory``, in the lifecycle's order: state, drafts, admission, consolidation,
retirement, active selection, resume; its rows in ``records.py``, n_r / rho_r in ``rubric_stats.py``), the
sparse pairwise graph and its scores (``sparse_graph.py``, no judge call), group scoring through a judge
(``scoring.py``), anchor selection (``induction.py``, eq. 1, A.1), and the judge roles ARBOR asks (``roles.py``: induction, consolidation, pairwise;
their prompts in ``prompts/`` and offline heuristics in ``heuristics.py``). The shaping of eq. 3/4
(``tasks/shaping.py``) is shared with every method, so it stays in ``tasks/``; ARBOR's rubric lifecycle tables are
the pipeline's (``storage/schemas.py``), which the report and ``sql/`` read."""

from arbor.tasks.methods.arbor import roles as roles  # registers its judge roles (roles.py, prompts/)

# the method (and the trainer's torch behind it) loads on first use, so that its judge roles can be read without
# it: preflight renders them to size the judge's window on a machine without torch's import time
_LAZY = {"MEMORY_STAGES", "Arbor", "induce_drafts", "induce_group", "rebuild_memory"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module("arbor.tasks.methods.arbor.method"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["MEMORY_STAGES", "Arbor", "induce_drafts", "induce_group", "rebuild_memory", "roles"]
