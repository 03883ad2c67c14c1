from __future__ import annotations

import itertools

import pytest

from ledger import transitions
from ledger.models import Operation, OperationEvent
from ledger.transitions import ALLOWED_TRANSITIONS, InvalidTransition, StaleFencingToken
from tests.ledger.factories import in_flight, in_state, prepared

S = Operation.Status
STATUSES = [s.value for s in S]
ALLOWED = {(a, b) for a, targets in ALLOWED_TRANSITIONS.items() if a for b in targets}


def apply(operation: Operation, to_status: str) -> Operation:
    """Drive one transition through the public function that owns it."""
    token = operation.fencing_token
    if to_status == S.IN_FLIGHT:
        claim = transitions.operation_claim(operation, worker="t", lease_seconds=30,
                                            from_status=operation.status)
        if claim is None:
            raise InvalidTransition(operation.status, to_status)
        return claim.operation
    if to_status == S.SUCCEEDED:
        return transitions.operation_succeed(
            operation=operation, fencing_token=token if operation.status == S.IN_FLIGHT else None,
            result={"id": "x"}, provider_request_id="x", actor="t", reason="r")
    if to_status == S.FAILED:
        return transitions.operation_fail(
            operation=operation,
            fencing_token=token if operation.status == S.IN_FLIGHT else None,
            from_status=operation.status, error_class="e", actor="t", reason="r")
    if to_status == S.PREPARED:
        return transitions.operation_release(operation=operation, fencing_token=token,
                                             error_class="e", actor="t")
    if to_status == S.UNKNOWN:
        return transitions.operation_mark_unknown(operation=operation, fencing_token=token,
                                                  error_class="e", actor="t", reason="r")
    raise AssertionError(to_status)


def test_the_table_is_the_designs_state_machine():
    assert ALLOWED == {
        ("prepared", "in_flight"), ("prepared", "failed"),
        ("in_flight", "succeeded"), ("in_flight", "failed"), ("in_flight", "prepared"),
        ("in_flight", "unknown"),
        ("unknown", "in_flight"), ("unknown", "succeeded"), ("unknown", "failed"),
    }
    assert ALLOWED_TRANSITIONS[S.SUCCEEDED] == frozenset()
    assert ALLOWED_TRANSITIONS[S.FAILED] == frozenset()


@pytest.mark.parametrize(("from_status", "to_status"), sorted(ALLOWED))
def test_allowed_transition_moves_the_row_and_appends_one_event(agent, from_status, to_status):
    operation = in_state(agent, from_status)
    events_before = OperationEvent.objects.filter(operation=operation).count()

    moved = apply(operation, to_status)

    stored = Operation.objects.get(pk=operation.pk)
    assert moved.status == stored.status == to_status
    events = list(OperationEvent.objects.filter(operation=operation).order_by("id"))
    assert len(events) == events_before + 1
    assert (events[-1].from_status, events[-1].to_status) == (from_status, to_status)
    assert events[-1].fencing_token == stored.fencing_token


DISALLOWED = sorted(
    (a, b) for a, b in itertools.product(STATUSES, STATUSES) if a != b and (a, b) not in ALLOWED
)


@pytest.mark.parametrize(("from_status", "to_status"), DISALLOWED)
def test_disallowed_transition_raises_and_writes_nothing(agent, from_status, to_status):
    operation = in_state(agent, from_status)
    before = Operation.objects.filter(pk=operation.pk).values().get()
    events_before = OperationEvent.objects.count()

    with pytest.raises((InvalidTransition, StaleFencingToken)):
        apply(operation, to_status)

    assert Operation.objects.filter(pk=operation.pk).values().get() == before
    assert OperationEvent.objects.count() == events_before


def test_check_transition_rejects_anything_to_prepared_from_new_row_except_prepared():
    transitions.check_transition(None, S.PREPARED)
    for status in (S.IN_FLIGHT, S.SUCCEEDED, S.FAILED, S.UNKNOWN):
        with pytest.raises(InvalidTransition):
            transitions.check_transition(None, status)


def test_transition_to_the_current_state_is_idempotent_and_writes_no_event(agent):
    operation, token = in_flight(agent)
    done = transitions.operation_succeed(operation=operation, fencing_token=token, result={},
                                         provider_request_id="p", actor="t", reason="r")
    events = OperationEvent.objects.count()

    again = transitions.operation_succeed(operation=done, fencing_token=token, result={},
                                          provider_request_id="p", actor="t", reason="r")

    assert again.status == S.SUCCEEDED
    assert OperationEvent.objects.count() == events


def test_claim_bumps_fencing_token_sets_lease_and_counts_the_attempt(agent):
    operation = prepared(agent)
    claim = transitions.operation_claim(operation, worker="w1", lease_seconds=30)
    stored = Operation.objects.get(pk=operation.pk)
    assert claim is not None and claim.fencing_token == stored.fencing_token == 1
    assert stored.status == S.IN_FLIGHT and stored.attempts == 1
    assert stored.lease_owner == "w1" and stored.lease_expires_at is not None
    assert stored.key_first_sent_at is not None


def test_second_claim_on_a_stale_copy_loses_and_writes_nothing(agent):
    operation = prepared(agent)
    stale_copy = Operation.objects.get(pk=operation.pk)
    assert transitions.operation_claim(operation, worker="w1", lease_seconds=30) is not None
    events = OperationEvent.objects.count()

    assert transitions.operation_claim(stale_copy, worker="w2", lease_seconds=30) is None

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.lease_owner == "w1" and stored.fencing_token == 1
    assert OperationEvent.objects.count() == events


def test_stale_fencing_token_cannot_overwrite_a_newer_attempt(agent):
    operation, old_token = in_flight(agent)
    unknown = transitions.operation_mark_unknown(operation=operation, fencing_token=old_token,
                                                 error_class="e", actor="t", reason="r")
    newer = transitions.operation_claim(unknown, worker="reconciler", lease_seconds=30,
                                        from_status=S.UNKNOWN)
    assert newer is not None and newer.fencing_token == old_token + 1

    with pytest.raises(StaleFencingToken):
        transitions.operation_succeed(
            operation=Operation.objects.get(pk=operation.pk), fencing_token=old_token,
            result={"id": "late"}, provider_request_id="late", actor="old-worker", reason="r")

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.status == S.IN_FLIGHT and stored.fencing_token == old_token + 1
    assert stored.result is None


def test_stale_result_after_newer_attempt_finished_is_rejected(agent):
    operation, old_token = in_flight(agent)
    unknown = transitions.operation_mark_unknown(operation=operation, fencing_token=old_token,
                                                 error_class="e", actor="t", reason="r")
    newer = transitions.operation_claim(unknown, worker="r", lease_seconds=30,
                                        from_status=S.UNKNOWN)
    transitions.operation_fail(operation=newer.operation, fencing_token=newer.fencing_token,
                               error_class="http_402", actor="r", reason="provider_rejected")

    with pytest.raises(StaleFencingToken):
        transitions.operation_succeed(
            operation=Operation.objects.get(pk=operation.pk), fencing_token=old_token,
            result={"id": "late"}, provider_request_id="late", actor="old", reason="r")
    assert Operation.objects.get(pk=operation.pk).status == S.FAILED


def test_lease_expiry_moves_in_flight_to_unknown_only_after_the_lease(agent, frozen):
    operation, _ = in_flight(agent, lease_seconds=30)
    assert transitions.operation_expire_lease(operation=operation).status == S.IN_FLIGHT

    frozen.shift(31)
    expired = transitions.operation_expire_lease(operation=Operation.objects.get(pk=operation.pk))

    assert expired.status == S.UNKNOWN
    event = OperationEvent.objects.filter(operation=operation).latest("id")
    assert (event.from_status, event.to_status, event.reason) == (
        "in_flight", "unknown", "lease_expired")


def test_events_are_append_only(agent):
    from ledger.models import AppendOnlyError

    event = OperationEvent.objects.filter(operation=prepared(agent)).get()
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.delete()
