"""The judge's roles, each declared once (issue 31 item 1): its request, prompt, reply schema, parser, offline
heuristic and reply budget, registered by name in ``llm.base.REGISTRY``.

One file per method family: ``arbor`` (App. E: induction, consolidation, pairwise, accuracy), ``rar`` (C.3),
``rubricem`` (C.2, C.3, D.6.2), ``arco`` (the step-label teacher) and ``coreact`` (§3.1-3.3). Both backends are
generic over roles, so a method adds one by declaring a ``Role`` and registering it; ``Judge.ask(name, ...)``
calls it.
"""

from __future__ import annotations

from arbor.llm.base import REGISTRY
from arbor.llm.roles import arbor, arco, coreact, rar, rubricem

REGISTERED = tuple(REGISTRY)  # the built-in roles, in declaration order
__all__ = ["REGISTERED", "arbor", "arco", "coreact", "rar", "rubricem"]
