"""Co-ReAct (Kang et al., 2026) as a package. It is not a training method but an inference-time wrapper
and a generator-training flow: its equations as pure functions (``equations.py``), guided inference with a step
rubric and a verifier (``guidance.py``), the rubric generator's list-wise training (``generator.py``), and what it
stores (``tables.py``, ``sql/``)."""

from arbor.tasks.methods.coreact import roles as roles  # registers its judge roles (roles.py, prompts/)
from arbor.tasks.methods.coreact import tables as tables  # registers its tables with the store
