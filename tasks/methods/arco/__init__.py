"""ARCO as a package: the method (``method.py``: its stages and decisions), its equations as pure
functions (``equations.py``), its rubric model mu (``rubric_model.py``), and what it stores (``tables.py``,
``sql/``)."""

from arbor.tasks.methods.arco import roles as roles  # registers its judge roles (roles.py, prompts/)
from arbor.tasks.methods.arco.method import ARCO

__all__ = ["ARCO", "roles"]
