"""The dashboard's counters: replays and conflicts tallied in memory and flushed in one upsert,
everything else rolled up from the event rows once a minute has closed."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ledger import tally
from ledger import transitions as ledger_transitions
from ledger.models import Operation
from ops import rollup
from ops.models import RollupCursor, Stat
from ops.series import PERIODS, quantile, read_period
from reconciliation import transitions as case_transitions
from reconciliation.models import Case
from tests.conftest import submit_body
from tests.ops.conftest import op_in

S = Operation.Status


def counts(metric: str, grain: str = "minute", **match: str) -> dict[str, int]:
    rows = Stat.objects.filter(grain=grain, metric=metric, **match)
    found: dict[str, int] = {}
    for detail, count in rows.values_list("detail", "count"):
        found[detail] = found.get(detail, 0) + count
    return found


def test_replays_and_conflicts_are_counted_without_a_statement_and_stored_on_flush(
        api: Any, sandbox: Any) -> None:
    assert api.post("/api/v1/operations", submit_body(), format="json").status_code == 201
    with CaptureQueriesContext(connection) as captured:
        for _ in range(2):
            assert api.post("/api/v1/operations", submit_body(),
                            format="json").status_code == 200
    conflicting = submit_body(params={**submit_body()["params"], "amount": 2600})
    assert api.post("/api/v1/operations", conflicting, format="json").status_code == 422
    assert not any("ops_stat" in q["sql"] for q in captured.captured_queries)
    assert not Stat.objects.exists()
    assert sum(tally.pending().values()) == 3

    assert tally.flush() == 3
    for grain in ("minute", "hour", "day"):
        assert counts("replay", grain, tool="refund", provider="sandbox") == {"": 2}
        assert counts("conflict", grain, tool="refund", provider="sandbox") == {"": 1}
    assert tally.pending() == {}


def test_a_due_flush_happens_at_the_end_of_a_request(db: None, settings: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    settings.LEDGER_TALLY_FLUSH_SECONDS = 5
    tally.count("replay", tool="refund", provider="sandbox")
    Client().get("/healthz")  # not due yet: the last flush was just now (the fixture's)
    monkeypatch.setattr(tally, "_last_flush", time.monotonic() - 6)
    assert not Stat.objects.exists()
    Client().get("/healthz")
    assert counts("replay") == {"": 1}


def test_counts_survive_a_failed_flush(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(counted: Any) -> None:
        raise RuntimeError("database away")

    monkeypatch.setattr(tally, "_sink", broken)
    tally.count("conflict", tool="refund", provider="sandbox")
    assert tally.flush() == 0
    assert sum(tally.pending().values()) == 1


def test_rollup_counts_fresh_actions_outcomes_and_provider_answers(
        agent: Any, frozen: Any) -> None:
    op_in(agent, S.SUCCEEDED, 1)
    op_in(agent, S.SUCCEEDED, 2)
    op_in(agent, S.FAILED, 3)
    op_in(agent, S.PREPARED, 4)
    frozen.shift(90)
    report = rollup.rollup_until_current()
    assert report.events > 0
    assert counts("fresh", tool="refund") == {"": 4}
    assert counts("outcome", tool="refund") == {"succeeded": 2, "failed": 1}
    assert counts("provider_call", provider="sandbox") == {"succeeded": 2, "failed": 1}
    assert counts("provider_error", provider="sandbox") == {"http_402.rejected": 1}
    latency = counts("provider_latency", provider="sandbox")
    assert sum(latency.values()) == 3 and set(latency) == {"0.01"}  # frozen clock: 0 s
    assert counts("fresh", "day", tool="refund") == {"": 4}


def test_rollup_tells_how_unknowns_ended_and_how_long_they_took(
        agent: Any, frozen: Any) -> None:
    proven = op_in(agent, S.UNKNOWN, 1)
    decided = op_in(agent, S.UNKNOWN, 2)
    absent = op_in(agent, S.UNKNOWN, 3)
    frozen.shift(290)
    case_transitions.case_resolve(case=Case.objects.get(operation=proven), outcome=S.SUCCEEDED,
                                  actor="reconciler", reason="lookup_proved_success")
    case_transitions.case_resolve(case=Case.objects.get(operation=absent), outcome=S.FAILED,
                                  actor="reconciler", reason="lookup_proved_absent")
    frozen.shift(3600)
    case_transitions.case_resolve(case=Case.objects.get(operation=decided), outcome=S.SUCCEEDED,
                                  actor="staff:ann", reason="staff_confirmed")
    frozen.shift(90)
    rollup.rollup_until_current()
    assert counts("unknown_opened", "day") == {"": 3}
    assert counts("unknown_ended", "day") == {"proven_succeeded": 1, "proven_failed": 1,
                                              "person": 1}
    assert counts("resolution", "day") == {"300": 2, "7200": 1}
    total = Stat.objects.filter(grain="day", metric="resolution").values_list("total", flat=True)
    assert sum(total) == pytest.approx(290 * 2 + 3890)


def test_a_resend_that_stays_unknown_is_not_a_new_unknown(agent: Any, frozen: Any) -> None:
    operation = op_in(agent, S.UNKNOWN, 1)
    claim = ledger_transitions.operation_claim(operation, worker="reconciler", lease_seconds=60,
                                               from_status=S.UNKNOWN, reason="reconciler_resend")
    assert claim is not None
    frozen.shift(2)
    ledger_transitions.operation_mark_unknown(
        operation=claim.operation, fencing_token=claim.fencing_token,
        error_class="transport.ReadTimeout", actor="reconciler", reason="timeout_after_send",
        data={"error_class": "transport.ReadTimeout"})
    frozen.shift(90)
    rollup.rollup_until_current()
    assert counts("unknown_opened", "day") == {"": 1}
    assert counts("provider_call", "day") == {"unknown": 2}
    assert counts("provider_latency", "day") == {"0.01": 1, "2.5": 1}


def test_a_rollup_never_counts_a_minute_twice_and_waits_for_it_to_close(
        agent: Any, frozen: Any) -> None:
    frozen.move_to(dt.datetime(2026, 11, 30, 10, 0, 5, tzinfo=dt.UTC))
    op_in(agent, S.SUCCEEDED, 1)
    rollup.rollup_until_current()
    assert counts("fresh") == {}  # 10:00 has not closed yet
    frozen.shift(60 + 30)  # 10:01:35 — 10:00 is over and settled
    rollup.rollup_until_current()
    rollup.rollup_until_current()
    assert counts("fresh") == {"": 1}
    cursor = RollupCursor.objects.get()
    assert cursor.rolled_until == dt.datetime(2026, 11, 30, 10, 1, tzinfo=dt.UTC)


def test_old_minutes_and_hours_are_pruned(db: None, frozen: Any) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(hours=5)
    rollup.add([rollup.Fact(old, "fresh", "refund", "sandbox")])
    assert Stat.objects.filter(grain="minute").count() == 1
    rollup.rollup()
    assert not Stat.objects.filter(grain="minute").exists()
    assert Stat.objects.filter(grain="day").count() == 1


def test_period_series_put_each_count_in_its_bucket(db: None, frozen: Any) -> None:
    frozen.move_to(dt.datetime(2026, 11, 30, 10, 30, 0, tzinfo=dt.UTC))
    now = dt.datetime.now(dt.UTC)
    rollup.add([rollup.Fact(now - dt.timedelta(minutes=5), "fresh", "refund", "sandbox",
                            count=3),
                rollup.Fact(now - dt.timedelta(hours=3), "fresh", "refund", "sandbox", count=2),
                rollup.Fact(now - dt.timedelta(days=2), "replay", "refund", "sandbox")])
    hour = read_period(PERIODS["hour"], now)
    assert hour.series("fresh")[-6] == 3 and sum(hour.series("fresh")) == 3
    day = read_period(PERIODS["day"], now)
    assert sum(day.series("fresh")) == 5 and day.series("fresh")[-4] == 2
    month = read_period(PERIODS["month"], now)
    assert sum(month.series("replay")) == 1 and month.series("replay")[-3] == 1


def test_quantiles_interpolate_within_histogram_buckets() -> None:
    bounds = (1.0, 5.0, 10.0, float("inf"))
    assert quantile({}, 0.5, bounds) is None
    assert quantile({"1": 10}, 0.5, bounds) == pytest.approx(0.5)
    assert quantile({"1": 5, "5": 5}, 0.75, bounds) == pytest.approx(3.0)
    assert quantile({"1": 1, "+Inf": 99}, 0.95, bounds) == pytest.approx(10.0)
