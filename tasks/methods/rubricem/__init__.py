"""RubricEM (§3.2-3.4, Alg. 1, App. D) as a package: the method (``method.py``: SS-GRPO plus the reflection
meta-policy and the rubric bank) and what it stores (``tables.py``, ``sql/``). The reflection mathematics it shares
with the SFT data builder stays in ``tasks/reflection.py``."""

from arbor.tasks.methods.rubricem import roles as roles  # registers its judge roles (roles.py, prompts/)
from arbor.tasks.methods.rubricem.method import RubricEM

__all__ = ["RubricEM", "roles"]
