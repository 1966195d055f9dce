"""Worked examples of arbor's extension points (docs/methods.md); each is run for one step by a test."""
