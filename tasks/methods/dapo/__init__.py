"""DAPO (Yu et al., 2025) as a package: the method (``method.py``) and its equations (``equations.py``: dynamic
sampling's filter and refill, the soft overlong punishment of eq. 13)."""

from arbor.tasks.methods.dapo.method import DAPO

__all__ = ["DAPO"]
