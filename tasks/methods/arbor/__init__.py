"""ARBOR (the paper) as a package: the method (``method.py``: its stage graph and decisions), the rubric memory
(``memory.py``: admission, consolidation, retirement, active selection), sparse pairwise judging (``judge.py``)
and group scoring through a judge (``scoring.py``), anchor selection (``induction.py``, eq. 1, A.1), and the judge
roles ARBOR asks (``roles.py``: induction, consolidation, pairwise; their prompts in ``prompts/`` and offline
heuristics in ``heuristics.py``). The shaping of eq. 3/4 (``tasks/shaping.py``) is shared with every method, so it
stays in ``tasks/``; ARBOR's rubric lifecycle tables are the pipeline's (``storage/schemas.py``), which the report
and ``sql/`` read."""

from arbor.tasks.methods.arbor import roles as roles  # registers its judge roles (roles.py, prompts/)
from arbor.tasks.methods.arbor.method import MEMORY_STAGES, Arbor, induce_drafts, induce_group, rebuild_memory

__all__ = ["MEMORY_STAGES", "Arbor", "induce_drafts", "induce_group", "rebuild_memory", "roles"]
