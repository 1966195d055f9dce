"""The RaR baseline (Gunjal et al., 2025; paper App. C.3) in one place: the method (``method.py``) and the judge
roles it asks, with their prompts and offline heuristics (``roles.py``, ``prompts/``)."""

from arbor.tasks.methods.rar import roles as roles  # registers its judge roles

# the method (and the trainer's torch behind it) loads on first use, so that its judge roles can be read without
# it: preflight renders them to size the judge's window on a machine without torch's import time
_LAZY = {"RaR", "rating_to_score"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module("arbor.tasks.methods.rar.method"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["RaR", "rating_to_score", "roles"]
