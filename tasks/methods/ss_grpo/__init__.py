"""SS-GRPO (RubricEM §3.3, eq. 1; App. C) as a package: the method (``method.py``), its stagewise equations and
stage buffer (``stagewise.py``), and what it stores (``tables.py``, ``sql/``)."""

from arbor.tasks.methods.ss_grpo import roles as roles  # registers its judge roles (roles.py, prompts/)
from arbor.tasks.methods.ss_grpo.method import SSGRPO

__all__ = ["SSGRPO", "roles"]
