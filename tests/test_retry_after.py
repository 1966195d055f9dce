"""The one reading of a server's requested wait (arbor.runtime.retry_after), shared by the judge and the web search."""

from __future__ import annotations

import httpx
import pytest

from arbor.runtime.retry_after import backoff_s, requested_wait_s, retry_after_s

NOW = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT


def test_delay_seconds_and_http_dates() -> None:
    assert retry_after_s("Wed, 21 Oct 2015 07:28:05 GMT", now=NOW) == 5.0
    assert retry_after_s("Wed, 21 Oct 2015 07:27:00 GMT", now=NOW) == 0.0  # in the past: at once
    assert retry_after_s(" 7 ") == 7.0 and retry_after_s("-3") == 0.0
    assert retry_after_s("soon") is None and retry_after_s("inf") is None and retry_after_s(None) is None


def test_milliseconds_first_then_retry_after() -> None:
    """OpenAI sends ``retry-after-ms`` beside ``retry-after``: the finer one wins; an unreadable one is skipped."""
    both = httpx.Headers({"Retry-After-Ms": "1500", "Retry-After": "9"})
    assert requested_wait_s(both) == 1.5
    assert requested_wait_s(httpx.Headers({"retry-after-ms": "later", "retry-after": "9"})) == 9.0
    assert requested_wait_s(httpx.Headers({"retry-after-ms": "nan", "retry-after": "2"})) == 2.0
    dated = httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"})
    assert requested_wait_s(dated, now=NOW) == 30.0
    assert requested_wait_s(httpx.Headers({"retry-after-ms": "-5"})) == 0.0
    assert requested_wait_s(httpx.Headers({})) is None and requested_wait_s(None) is None


def test_backoff_doubles_to_its_cap_and_jitters_in_the_upper_half() -> None:
    """``backoff_s`` by hand: base 0.5, cap 8: 0.5, 1, 2, 4, 8, 8; with u the wait is b * (1 + u) / 2."""
    assert [backoff_s(0.5, 8.0, r) for r in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert backoff_s(0.5, 30.0, 3, 0.0) == 2.0  # [b/2, b): the lower end at u = 0
    assert backoff_s(0.5, 30.0, 3, 0.5) == 3.0
    assert backoff_s(2.0, 5.0, 4, 0.9) == pytest.approx(5.0 * 0.95)  # capped first, then jittered
