"""Prometheus metrics (text format at /metrics). Counters live in the process that increments
them; gauges about rows are computed from the database at scrape time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

if TYPE_CHECKING:
    from ledger.providers.base import SendOutcome

OPERATIONS = Counter(
    "ledger_operations_total", "Operations reaching an outcome, by tool and outcome",
    ["tool", "outcome"],
)
REPLAYS = Counter("ledger_replays_total", "Replays of terminal operations served", ["tool"])
CONFLICTS = Counter(
    "ledger_params_conflicts_total", "Same operation ID submitted with different intent", ["tool"]
)
PROVIDER_LATENCY = Histogram(
    "ledger_provider_call_seconds", "Provider call latency", ["provider", "call"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
SEND_OUTCOMES = Counter(
    "ledger_provider_send_outcomes_total",
    "Provider sends by outcome (confirmed, rejected, not_sent, unknown) and error class",
    ["provider", "outcome", "error_class"],
)
_OUTCOME_NAMES = {"Confirmed": "confirmed", "Rejected": "rejected", "NotSent": "not_sent",
                  "Unknown": "unknown"}


def count_send_outcome(provider: str, outcome: SendOutcome) -> None:
    """The provider error rate's numerator (not_sent + unknown) and denominator (all)."""
    name = _OUTCOME_NAMES.get(type(outcome).__name__, "unknown")
    SEND_OUTCOMES.labels(provider, name, getattr(outcome, "error_class", "")).inc()
