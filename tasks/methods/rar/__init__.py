"""The RaR baseline (Gunjal et al., 2025; paper App. C.3) in one place: the method (``method.py``) and the judge
roles it asks, with their prompts and offline heuristics (``roles.py``, ``prompts/``)."""

from arbor.tasks.methods.rar import roles as roles  # registers its judge roles
from arbor.tasks.methods.rar.method import RaR, rating_to_score

__all__ = ["RaR", "rating_to_score", "roles"]
