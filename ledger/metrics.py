"""Prometheus metrics (text format at /metrics). Counters live in the process that increments
them; gauges about rows are computed from the database at scrape time."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
