"""Evaluation and reporting: held-out evaluation (``evaluate``), the run report (``report``), learning curves
across seeds (``curves``) and step-metric trackers (``tracking``)."""
