"""How long to wait before retrying, one way for every HTTP client in arbor (the judge's OpenAI-compatible endpoints,
the web search backends, the rollout server while paused): what the server asks for (RFC 9110 §10.2.3), else our
own capped exponential backoff (``backoff_s``)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """The wait a ``Retry-After`` value asks for: delay-seconds or an HTTP date (``now``: the clock, epoch
    seconds); None when absent or unreadable (the caller backs off on its own). Never negative."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def requested_wait_s(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """The wait a response's headers ask for: ``retry-after-ms`` (OpenAI's and Azure's, milliseconds) when it reads
    as a number, else ``Retry-After`` (seconds or a date); None when neither does. ``headers``: case-insensitive
    (httpx's)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            seconds = float(ms.strip()) / 1000.0
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return retry_after_s(headers.get("retry-after"), now)


def backoff_s(base_s: float, max_s: float, retry: int, u: float | None = None) -> float:
    """Capped exponential backoff: b = min(max_s, base_s * 2^retry); with ``u`` in [0, 1), "equal jitter", a wait in
    [b/2, b) (b * (1 + u) / 2), so clients that failed together do not retry together."""
    b = min(max_s, base_s * 2**retry)
    return b if u is None else b * (0.5 + 0.5 * u)
