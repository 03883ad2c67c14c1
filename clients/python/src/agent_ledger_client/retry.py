"""When to retry and how long to wait. Every retry re-sends the *same* request (the same
operation ID), so a retry can only ever be answered as a replay, never executed twice."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, capped; `Retry-After` wins when the server sends it.

    max_attempts counts the first try. max_retry_after caps how long one `Retry-After` may make
    the client wait (a longer one ends the retries and raises instead).
    """

    max_attempts: int = 5
    base_delay: float = 0.25
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before attempt number `attempt + 1` (attempt starts at 1)."""
        backoff = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        jittered = rng.uniform(0, backoff)
        if retry_after is not None:
            # The server knows when it can answer; a little jitter keeps many clients that
            # were told the same moment from arriving together.
            return min(self.max_retry_after, retry_after) + rng.uniform(0, self.base_delay)
        return jittered


NO_RETRIES = RetryPolicy(max_attempts=1)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """`Retry-After` as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
