"""The beat schedule, the thin tasks (run in-process here; a real worker in
test_celery_worker.py) and `manage.py reconcile`."""

from __future__ import annotations

import io

from django.conf import settings
from django.core.management import call_command

from config.celery import app as celery_app
from ledger.models import Operation
from reconciliation import tasks
from reconciliation.models import Case
from tests.reconciliation.helpers import REFUND_OP, fresh, unknown_refund

S = Operation.Status


def test_beat_runs_both_sweeps_and_the_unsent_sweep_at_the_sweep_interval():
    schedule = settings.CELERY_BEAT_SCHEDULE
    by_task = {entry["task"]: entry for entry in schedule.values()}
    sweeps = {"reconciliation.tasks.sweep_leases", "reconciliation.tasks.sweep_cases",
              "ledger.tasks.retry_unsent_operations", "ledger.tasks.sweep_webhooks"}
    # Plus the dashboard's counters (ops.rollup) and the hourly retention job
    # (tests/trust/test_retention.py), each on its own interval.
    assert set(by_task) == sweeps | {"ops.tasks.rollup_stats", "ledger.tasks.redact_expired_params"}
    for entry in (by_task[name] for name in sweeps):
        assert entry["schedule"] == settings.LEDGER_SWEEP_INTERVAL_SECONDS
        assert entry["options"]["expires"] >= settings.LEDGER_SWEEP_INTERVAL_SECONDS
    import ledger.tasks  # noqa: F401  (the worker imports both through autodiscovery)
    import ops.tasks  # noqa: F401

    assert set(by_task) <= set(celery_app.tasks)
    assert celery_app.conf.beat_schedule == schedule  # Celery reads it, no database scheduler


def test_tasks_carry_their_time_limits():
    for task in (tasks.sweep_leases, tasks.sweep_cases, tasks.reconcile_case):
        assert task.soft_time_limit == settings.RECONCILIATION_SWEEP_SOFT_TIME_LIMIT
        assert task.time_limit == settings.RECONCILIATION_SWEEP_TIME_LIMIT
    assert tasks.reconcile_case.max_retries == settings.RECONCILIATION_TASK_MAX_RETRIES


def test_the_case_sweep_task_reconciles_a_due_case(agent, sandbox):
    operation = unknown_refund(agent, "lose-response")

    result = tasks.sweep_cases.apply().get()

    assert result == {"leased": 1, "outcomes": {S.SUCCEEDED: 1}, "errors": 0}
    assert fresh(operation)[0].status == S.SUCCEEDED
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_the_reconcile_task_skips_a_case_that_is_not_due(agent, sandbox):
    operation = unknown_refund(agent, "lose-response")
    case = Case.objects.get()
    Case.objects.filter(pk=case.pk).update(next_check_at=case.next_check_at.replace(year=2999))

    assert tasks.reconcile_case.apply(args=[case.pk]).get() == "skipped"
    assert fresh(operation)[0].status == S.UNKNOWN


def test_manage_py_reconcile_sweeps_and_reports(agent, sandbox):
    operation = unknown_refund(agent, "lose-response")
    out = io.StringIO()

    call_command("reconcile", stdout=out)

    assert fresh(operation)[0].status == S.SUCCEEDED
    assert "leases expired: 0" in out.getvalue() and "'succeeded': 1" in out.getvalue()


def test_manage_py_reconcile_one_case_checks_it_even_when_not_due(agent, sandbox):
    operation = unknown_refund(agent, "lose-response")
    case = Case.objects.get()
    Case.objects.filter(pk=case.pk).update(next_check_at=case.next_check_at.replace(year=2999))
    out = io.StringIO()

    call_command("reconcile", case=case.pk, stdout=out)

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and out.getvalue().strip().endswith("succeeded")
    assert case.events.filter(reason="check_requested", actor="operator:manage.py").exists()


def test_manage_py_reconcile_also_sends_what_nobody_sent_and_records_every_sweep(
    agent, sandbox, frozen
):
    """Where no Celery beat runs, `manage.py reconcile --loop` is the sweeper: an async
    submission whose worker never came is sent by it, once, and readiness sees all three
    sweeps."""
    import datetime as dt

    from ledger import executor
    from reconciliation import health
    from tests.conftest import refund_params

    submitted = executor.submit(agent=agent, operation_id="wf-9:invoice-9:refund-1:v1",
                                tool_name="refund", params=refund_params(), execute=False)
    assert submitted.operation.status == S.PREPARED
    frozen.shift(dt.timedelta(seconds=11))  # older than the unsent sweeper's first wait
    out = io.StringIO()

    call_command("reconcile", stdout=out)

    operation = Operation.objects.get(pk=submitted.operation.pk)
    assert operation.status == S.SUCCEEDED and operation.attempts == 1
    assert sandbox.effect_counts() == {operation.operation_id: 1}
    assert "unsent sent: 1" in out.getvalue()
    finished = health.last_sweep_finished_at()
    assert all(finished[sweep] is not None for sweep in ("leases", "cases", "unsent"))
