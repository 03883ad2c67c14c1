"""The load shedder's counter (kept apart so the middleware imports no app code)."""

from __future__ import annotations

from prometheus_client import Counter

SHED = Counter("ledger_requests_shed_total", "Requests answered 503 overloaded, by cause",
               ["cause"])
