"""Reading a JSONL file a user hands us: every failure names the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def jsonl_rows(path: str | Path, error: type[Exception]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) of each non-blank line; a line that is not JSON, or bytes that are not UTF-8
    (a binary file), raise ``error`` naming ``path`` and the line."""
    n = 0
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise error(f"{path}:{n}: not valid JSON: {e.msg}") from e
                yield n, row
    except UnicodeDecodeError as e:
        raise error(f"{path}:{n + 1}: not UTF-8 text (a binary file?)") from e
