"""Each strategy path of DESIGN §5 against the real sandbox provider process."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import time

import httpx
import pytest
from django.utils import timezone

from ledger import executor
from ledger import transitions as ledger_transitions
from ledger.models import Operation
from ledger.providers.base import Confirmed
from reconciliation.models import Case
from tests.conftest import adapter_named, refund_params
from tests.reconciliation.helpers import (
    REFUND_OP,
    TICKET_OP,
    case_reasons,
    evidence_of,
    fresh,
    operation_reasons,
    posts,
    sweep,
    ticket_params,
    unknown_refund,
    unknown_ticket,
)

S = Operation.Status
DAY = 24 * 3600


def move(frozen, sandbox, seconds: float) -> None:
    frozen.shift(seconds)
    sandbox.advance_clock(seconds)


def until_next_check(frozen, sandbox, case: Case) -> None:
    case.refresh_from_db()
    move(frozen, sandbox, max(0.0, (case.next_check_at - timezone.now()).total_seconds()))


# --- strategy 1: same-key re-send -----------------------------------------------------------

def test_lost_response_is_resent_with_the_same_key_and_succeeds_with_one_effect(agent, sandbox):
    operation = unknown_refund(agent, "lose-response")
    assert sandbox.effect_counts() == {REFUND_OP: 1}

    report = sweep()

    operation, case = fresh(operation)
    assert report.outcomes == {"succeeded": 1}
    assert operation.status == S.SUCCEEDED and operation.attempts == 2
    assert operation.provider_request_id == sandbox.effects(reference=REFUND_OP)[0]["id"]
    assert case.state == Case.State.RESOLVED
    assert (case.resolution, case.resolved_by) == ("provider_confirmed", "reconciler")
    assert case.resolved_at is not None and case.next_check_at is None
    assert case.strategies_tried == ["resend"] and case.attempts == 1
    [resend] = evidence_of(case)
    assert (resend.kind, resend.outcome, resend.actor) == ("resend", "confirmed", "reconciler")
    assert resend.request["idempotency_key"] == operation.idempotency_key
    assert resend.response["replayed"] is True
    assert case_reasons(case) == ["case_opened", "provider_confirmed"]
    assert operation_reasons(operation)[-2:] == ["reconciler_resend", "provider_confirmed"]
    # Exactly one effect, and every request carried the one stored key.
    assert sandbox.effect_counts() == {REFUND_OP: 1} and posts(sandbox) == 2
    assert {e["idempotency_key"] for e in sandbox.effects()} == {operation.idempotency_key}
    assert sweep().leased == 0


def test_drop_before_commit_inside_retention_is_resent_and_executes_once(agent, sandbox):
    operation = unknown_refund(agent, "drop-before-commit")
    assert sandbox.effect_counts() == {}

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and case.state == Case.State.RESOLVED
    [resend] = evidence_of(case)
    assert resend.outcome == "confirmed" and resend.response["replayed"] is False
    assert sandbox.effect_counts() == {REFUND_OP: 1} and posts(sandbox) == 2


def test_500_after_commit_is_resent_and_replayed(agent, sandbox):
    operation = unknown_refund(agent, "500-after-commit")

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and case.open_reason == "ambiguous_5xx"
    assert evidence_of(case)[0].response["replayed"] is True
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_provider_still_executing_409_means_check_again_later(
    agent, sandbox, settings, time_machine
):
    # The provider commits, then takes 1 s (real time: its own process) to answer; the ledger
    # gives up after 0.3 s, and the key stays "in progress" at the provider until it answers.
    settings.LEDGER_PROVIDER_TIMEOUT_SECONDS = 0.3
    sandbox.configure(timeout_sleep_seconds=1.0)
    started = time.monotonic()
    operation = unknown_refund(agent, "timeout")

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN and case.state == Case.State.CHECKING
    [in_progress] = evidence_of(case)
    assert in_progress.outcome == "in_progress"
    assert in_progress.response["error_class"].startswith("http_409")
    assert case_reasons(case)[-1] == "provider_in_progress"
    assert case.next_check_at > timezone.now()
    assert sweep().leased == 0  # not due again yet
    time.sleep(max(0.0, 1.3 - (time.monotonic() - started)))  # the provider's own sleep
    time_machine.move_to(case.next_check_at, tick=True)

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and case.state == Case.State.RESOLVED
    assert [e.outcome for e in evidence_of(case)] == ["in_progress", "confirmed"]
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_resend_that_never_left_returns_the_operation_to_unknown_not_prepared(
    agent, sandbox, sandbox_server, refused_provider, settings, frozen
):
    settings.SANDBOX_URL = sandbox_server.url
    operation = unknown_refund(agent, "lose-response")
    settings.SANDBOX_URL = refused_provider

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN and case.state == Case.State.CHECKING
    assert operation_reasons(operation)[-2:] == ["reconciler_resend", "resend_not_sent"]
    assert [e.outcome for e in evidence_of(case)] == ["not_sent"]
    assert case_reasons(case)[-1] == "resend_not_sent"

    settings.SANDBOX_URL = sandbox_server.url
    until_next_check(frozen, sandbox, case)
    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and operation.attempts == 3
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_key_used_with_other_params_at_the_provider_is_an_anomaly(agent, sandbox):
    operation = executor.submit(agent=agent, operation_id=REFUND_OP, tool_name="refund",
                                params=refund_params(), execute=False).operation
    # Somebody else sends our key first, with another amount.
    httpx.post(f"{sandbox.url}/v1/effects/refund",
               headers={"Idempotency-Key": operation.idempotency_key},
               json={"reference": REFUND_OP, "params": refund_params(amount=9999)})
    operation = executor.execute_prepared(operation)
    assert operation.status == S.UNKNOWN

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "anomaly")
    assert evidence_of(case)[0].response["error_class"].startswith("http_422")
    assert sandbox.effect_counts() == {REFUND_OP: 1}  # only the impostor's


# --- strategy 2: lookup ------------------------------------------------------------------

def test_lookup_lag_on_a_keyless_provider_is_polled_with_backoff_until_found(
    agent, sandbox, frozen
):
    # A worker claims and sends; the provider commits, but its index shows the ticket only
    # 10 s later; the worker dies before writing the answer down.
    operation = executor.submit(
        agent=agent, operation_id=TICKET_OP, tool_name="create_ticket",
        params=ticket_params(description="sandbox:lookup-lag-10"), execute=False).operation
    claim = ledger_transitions.operation_claim(operation, worker="doomed", lease_seconds=1)
    answer = adapter_named("sandbox-nokeys").send(claim.operation, key="", timeout=1.0)
    assert isinstance(answer, Confirmed)
    move(frozen, sandbox, 2)
    from reconciliation import services

    assert services.sweep_expired_leases() == 1
    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN and case.open_reason == "lease_expired"

    for _ in range(10):
        sweep()
        case.refresh_from_db()
        if case.state != Case.State.CHECKING:
            break
        until_next_check(frozen, sandbox, case)

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED
    assert (case.resolution, case.strategies_tried) == ("lookup_proved_success", ["lookup"])
    lookups = evidence_of(case)
    outcomes = [e.outcome for e in lookups]
    assert outcomes[-1] == "found_match" and set(outcomes[:-1]) == {"not_found"}
    assert len(outcomes) >= 3
    gaps = [(b.created_at - a.created_at).total_seconds()
            for a, b in itertools.pairwise(lookups)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # exponential backoff
    assert operation.provider_request_id == answer.provider_request_id
    assert sandbox.effect_counts() == {TICKET_OP: 1}
    assert posts(sandbox) == 1  # a provider without keys is never sent anything again


def test_drop_before_commit_on_a_keyless_provider_fails_after_the_consistency_window(
    agent, sandbox, frozen
):
    operation = unknown_ticket(agent, "drop-before-commit")

    sweep()
    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN and case.state == Case.State.CHECKING
    assert evidence_of(case)[0].response == {"found": False, "absence_is_proof": False}

    for _ in range(12):
        until_next_check(frozen, sandbox, case)
        sweep()
        case.refresh_from_db()
        if case.state != Case.State.CHECKING:
            break

    operation, case = fresh(operation)
    assert operation.status == S.FAILED
    assert operation.error_class == "reconciliation.absent_at_provider"
    assert (case.resolution, case.resolved_by) == ("lookup_proved_absent", "reconciler")
    lookups = evidence_of(case)
    assert {e.outcome for e in lookups} == {"not_found"}
    assert lookups[-1].response["absence_is_proof"] is True
    window = dt.datetime.fromisoformat(lookups[-1].request["consistency_window_closes_at"])
    assert lookups[-1].created_at >= window > lookups[-2].created_at
    assert sandbox.effect_counts() == {} and posts(sandbox) == 1


def test_absence_that_is_not_authoritative_goes_to_review(agent, sandbox, frozen, monkeypatch):
    adapter = adapter_named("sandbox-nokeys")
    monkeypatch.setattr(adapter, "capabilities",
                        dataclasses.replace(adapter.capabilities, authoritative_absence=False))
    operation = unknown_ticket(agent, "drop-before-commit")
    move(frozen, sandbox, 60)

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW,
                                                "not_found_not_authoritative")
    assert [e.outcome for e in evidence_of(case)] == ["not_found"]


def test_lookup_that_finds_different_fields_is_an_anomaly_in_review(agent, sandbox):
    operation = unknown_ticket(agent, "drop-before-commit")
    # Something else opened a ticket under our reference, with another title.
    httpx.post(f"{sandbox.url}/v1/effects/ticket", json={
        "reference": TICKET_OP, "params": ticket_params(title="Close my account")})

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "anomaly")
    assert case.review_deadline_at is not None and case.next_check_at is None
    [lookup] = evidence_of(case)
    assert lookup.outcome == "found_mismatch"
    assert lookup.response["differences"] == {
        "title": {"expected": "Refund did not arrive", "found": "Close my account"}}
    assert case_reasons(case) == ["case_opened", "anomaly"]


def test_the_same_reference_found_twice_is_an_anomaly(agent, sandbox):
    operation = unknown_ticket(agent, "lose-response")
    httpx.post(f"{sandbox.url}/v1/effects/ticket",
               json={"reference": TICKET_OP, "params": ticket_params()})

    sweep()

    operation, case = fresh(operation)
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "anomaly")
    assert evidence_of(case)[0].outcome == "found_multiple"
    assert evidence_of(case)[0].response["matches"] == 2


def test_unavailable_lookup_backs_off_and_tries_again(
    agent, sandbox, sandbox_server, refused_provider, settings, frozen
):
    settings.SANDBOX_URL = sandbox_server.url
    operation = unknown_ticket(agent, "lose-response")
    settings.SANDBOX_URL = refused_provider

    sweep()

    operation, case = fresh(operation)
    assert case.state == Case.State.CHECKING and case_reasons(case)[-1] == "lookup_unavailable"
    assert evidence_of(case)[0].outcome == "unavailable"
    assert 1.0 <= (case.next_check_at - timezone.now()).total_seconds() <= 2.0
    assert sweep().leased == 0  # not due yet

    settings.SANDBOX_URL = sandbox_server.url
    until_next_check(frozen, sandbox, case)
    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED
    assert [e.outcome for e in evidence_of(case)] == ["unavailable", "found_match"]


# --- strategy 3: review ------------------------------------------------------------------

def test_retention_passed_goes_to_review_and_sends_nothing(agent, sandbox, frozen):
    operation = unknown_refund(agent, "drop-before-commit")
    sent_before = posts(sandbox)
    # A day later the provider has forgotten the key: a re-send now would execute again.
    move(frozen, sandbox, DAY + 60)

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW,
                                                "key_retention_passed")
    assert evidence_of(case) == []  # not even a lookup was made
    assert posts(sandbox) == sent_before and sandbox.effect_counts() == {}
    assert case_reasons(case) == ["case_opened", "key_retention_passed"]


def test_resend_stops_at_the_safety_margin_before_retention(agent, sandbox, frozen, settings):
    settings.RECONCILIATION_KEY_RETENTION_MARGIN_SECONDS = 3600
    settings.RECONCILIATION_CASE_DEADLINE_SECONDS = 2 * DAY
    operation = unknown_refund(agent, "drop-before-commit")
    # Inside the provider's retention (23 h 30 min < 24 h), but inside the margin too.
    move(frozen, sandbox, DAY - 1800)

    sweep()

    operation, case = fresh(operation)
    assert case.review_reason == "key_retention_passed"
    assert sandbox.effect_counts() == {}


def test_deadline_passed_goes_to_review_and_sends_nothing(agent, sandbox, frozen):
    operation = unknown_ticket(agent, "drop-before-commit")
    move(frozen, sandbox, 4 * 3600 + 1)

    sweep()

    operation, case = fresh(operation)
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "deadline_passed")
    assert evidence_of(case) == [] and posts(sandbox) == 1


@pytest.mark.parametrize(("fault", "lookup_outcome"), [
    ("lose-response", "found_match"),
    ("drop-before-commit", "not_found"),
])
def test_high_value_unknown_is_looked_up_never_resent_and_goes_to_review_with_evidence(
    agent, sandbox, fault, lookup_outcome
):
    operation = unknown_refund(agent, fault, amount=150_000)

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN  # a person decides, even when the lookup matches
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "high_value")
    assert case.value_amount == 150_000 and case.review_deadline_at is not None
    [lookup] = evidence_of(case)
    assert (lookup.kind, lookup.outcome) == ("lookup", lookup_outcome)
    assert lookup.request["idempotency_key"] == operation.idempotency_key
    assert case.strategies_tried == ["lookup"]
    assert posts(sandbox) == 1  # no automatic re-send
    assert "reconciler_resend" not in operation_reasons(operation)


# --- a worker that died between claim and result -------------------------------------------

@pytest.mark.parametrize("sent_before_dying", [True, False])
def test_worker_killed_between_claim_and_result_is_reconciled_with_one_effect(
    agent, sandbox, frozen, sent_before_dying
):
    from reconciliation import services

    operation = executor.submit(agent=agent, operation_id=REFUND_OP, tool_name="refund",
                                params=refund_params(), execute=False).operation
    claim = ledger_transitions.operation_claim(operation, worker="doomed", lease_seconds=60)
    if sent_before_dying:
        adapter_named("sandbox").send(claim.operation, key=claim.operation.idempotency_key,
                                    timeout=1.0)
    move(frozen, sandbox, 59)
    assert services.sweep_expired_leases() == 0  # still inside its lease
    move(frozen, sandbox, 2)
    assert services.sweep_expired_leases() == 1

    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN and case.open_reason == "lease_expired"
    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and case.state == Case.State.RESOLVED
    assert evidence_of(case)[0].response["replayed"] is sent_before_dying
    assert sandbox.effect_counts() == {REFUND_OP: 1}
