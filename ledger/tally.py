"""Counts of facts that are not state changes — replays served, params conflicts refused — kept
in process memory and handed to a sink in one batch every LEDGER_TALLY_FLUSH_SECONDS.

A replay must cost one indexed read (DESIGN §4.3), so counting it may not cost a statement:
the request only bumps a dictionary entry, and the flush (one multi-row upsert, done by the
sink the `ops` app registers) runs at the end of whichever request finds it due. Counts are
per minute, so a late flush still lands in the right minute. A process that dies loses at most
one interval of counts — the same as a Prometheus counter in that process.

The ledger does not import the dashboard: without a sink, counts are dropped.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from django.conf import settings
from django.utils import timezone

logger = logging.getLogger(__name__)

# (minute, kind, tool, provider) → count
Key = tuple[dt.datetime, str, str, str]
Sink = Callable[[Mapping[Key, int]], None]

_lock = threading.Lock()
_counts: Counter[Key] = Counter()
_last_flush = time.monotonic()
_sink: Sink | None = None
# Without a sink (or with a broken database) memory stays bounded: the oldest minutes go.
_MAX_KEYS = 10_000


def set_sink(sink: Sink | None) -> None:
    global _sink
    _sink = sink


def count(kind: str, *, tool: str, provider: str = "") -> None:
    minute = timezone.now().replace(second=0, microsecond=0)
    with _lock:
        _counts[(minute, kind, tool, provider)] += 1
        if len(_counts) > _MAX_KEYS:
            for key in sorted(_counts)[: len(_counts) - _MAX_KEYS]:
                del _counts[key]


def pending() -> dict[Key, int]:
    with _lock:
        return dict(_counts)


def discard() -> None:
    with _lock:
        _counts.clear()


def flush() -> int:
    """Hand everything counted so far to the sink; on failure the counts are kept for later."""
    global _last_flush
    with _lock:
        drained = dict(_counts)
        _counts.clear()
        _last_flush = time.monotonic()
    if not drained or _sink is None:
        return 0
    try:
        _sink(drained)
    except Exception:  # noqa: BLE001 - statistics must never fail a request
        logger.warning("tally flush failed; keeping %d count(s) for the next one", len(drained))
        with _lock:
            _counts.update(drained)
        return 0
    return sum(drained.values())


def flush_if_due(**kwargs: object) -> int:
    """Flush when the interval has passed (a request_finished receiver). An interval of 0
    turns automatic flushing off (the test suite does, so no request gains a statement)."""
    interval = float(getattr(settings, "LEDGER_TALLY_FLUSH_SECONDS", 10.0) or 0)
    if interval <= 0 or not _counts or time.monotonic() - _last_flush < interval:
        return 0
    return flush()
