"""The executor against the real sandbox provider process and its fault scenarios."""

from __future__ import annotations

import pytest

from ledger import executor
from ledger.models import Operation
from reconciliation.models import Case
from tests.conftest import refund_params

OP = "wf-81:invoice-17:refund-1:v1"
S = Operation.Status


def submit(agent, memo: str = "ok", **params):
    return executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                           params=refund_params(memo=memo, **params), run_id="run-1")


def reasons(operation: Operation) -> list[str]:
    return list(operation.events.order_by("id").values_list("reason", flat=True))


def test_lost_response_ends_unknown_not_failed_with_the_effect_at_the_provider(agent, sandbox):
    submission = submit(agent, "sandbox:lose-response")

    operation = Operation.objects.get(pk=submission.operation.pk)
    assert operation.status == S.UNKNOWN
    assert operation.error_class.startswith("transport.")
    assert sandbox.effect_counts() == {OP: 1}
    assert reasons(operation)[-1] == "connection_reset"
    case = Case.objects.get(operation=operation)
    assert case.open_reason == "connection_reset"


def test_timeout_after_commit_ends_unknown(agent, sandbox):
    operation = submit(agent, "sandbox:timeout").operation
    assert operation.status == S.UNKNOWN
    assert operation.error_class == "transport.ReadTimeout"
    assert Case.objects.get(operation=operation).open_reason == "timeout_after_send"
    assert sandbox.effect_counts() == {OP: 1}


def test_500_after_commit_ends_unknown(agent, sandbox):
    operation = submit(agent, "sandbox:500-after-commit").operation
    assert operation.status == S.UNKNOWN
    assert Case.objects.get(operation=operation).open_reason == "ambiguous_5xx"


def test_drop_before_commit_ends_unknown_because_nobody_can_tell(agent, sandbox):
    operation = submit(agent, "sandbox:drop-before-commit").operation
    assert operation.status == S.UNKNOWN
    assert sandbox.effect_counts() == {}
    assert Case.objects.filter(operation=operation).exists()


def test_definitive_rejection_ends_failed_with_no_case(agent, sandbox):
    operation = submit(agent, "sandbox:reject").operation
    assert operation.status == S.FAILED
    assert operation.error_class == "http_402.sandbox_rejected"
    assert operation.resolved_at is not None
    assert not Case.objects.filter(operation=operation).exists()
    assert sandbox.effect_counts() == {}


def test_refused_connection_leaves_prepared_and_a_later_call_sends_once(
    agent, sandbox, sandbox_server, refused_provider, settings
):
    first = submit(agent)
    operation = Operation.objects.get(pk=first.operation.pk)
    assert operation.status == S.PREPARED
    assert operation.error_class == "transport.ConnectError"
    assert reasons(operation) == ["intent_recorded", "claimed_for_send", "not_sent"]
    assert sandbox.request_counts()["total"] == 0

    settings.SANDBOX_URL = sandbox_server.url
    second = submit(agent)

    operation.refresh_from_db()
    assert second.operation.status == operation.status == S.SUCCEEDED
    assert operation.attempts == 2 and operation.fencing_token == 2
    assert sandbox.effect_counts() == {OP: 1}
    # A third call is a plain replay.
    assert submit(agent).disposition is executor.Disposition.REPLAYED
    assert sandbox.effect_counts() == {OP: 1}


def test_same_key_is_sent_on_every_attempt(agent, sandbox, sandbox_server, refused_provider,
                                           settings):
    submit(agent)
    settings.SANDBOX_URL = sandbox_server.url
    operation = submit(agent).operation
    effect = sandbox.effects(reference=OP)[0]
    assert effect["idempotency_key"] == operation.idempotency_key


def test_expired_lease_found_on_resubmission_becomes_unknown(agent, sandbox, frozen):

    from tests.ledger.factories import in_flight

    in_flight(agent, OP, lease_seconds=30, amount=2500, memo="ok")
    frozen.shift(31)

    submission = submit(agent)

    assert submission.operation.status == S.UNKNOWN
    assert Case.objects.get(operation=submission.operation).open_reason == "lease_expired"
    assert sandbox.request_counts()["total"] == 0


def test_stale_result_is_kept_as_evidence_and_not_applied(agent, sandbox):
    from ledger import transitions
    from ledger.providers.base import Confirmed
    from tests.ledger.factories import in_flight

    operation, old_token = in_flight(agent, OP)
    transitions.operation_mark_unknown(operation=operation, fencing_token=old_token,
                                       error_class="e", actor="t", reason="timeout_after_send")
    newer = transitions.operation_claim(Operation.objects.get(pk=operation.pk), worker="r",
                                        lease_seconds=30, from_status=S.UNKNOWN)
    old_claim = transitions.Claim(operation=Operation.objects.get(pk=operation.pk),
                                  fencing_token=old_token)

    result = executor.persist_outcome(
        old_claim, Confirmed(result={"id": "eff_old"}, provider_request_id="eff_old"),
        actor="worker:old")

    assert result.status == S.IN_FLIGHT and result.fencing_token == newer.fencing_token
    assert result.result is None
    stale = result.events.get(reason="stale_result_ignored")
    assert stale.fencing_token == old_token and stale.data["outcome"] == "Confirmed"


@pytest.mark.parametrize("tool_name", ["send_email", "create_ticket"])
def test_other_tools_execute_against_their_providers(agent, sandbox, tool_name):
    params = {
        "send_email": {"to": "ann@example.com", "template": "refund_sent", "subject": "Hi",
                       "body": "Your refund is on its way."},
        "create_ticket": {"queue": "billing", "customer": "cus_1", "title": "Refund check"},
    }[tool_name]
    submission = executor.submit(agent=agent, operation_id=f"wf-2:x:{tool_name}-1:v1",
                                 tool_name=tool_name, params=params)
    assert submission.operation.status == S.SUCCEEDED
    effect = sandbox.effects(reference=f"wf-2:x:{tool_name}-1:v1")[0]
    expected_key = None if tool_name == "create_ticket" else submission.operation.idempotency_key
    assert effect["idempotency_key"] == expected_key


def test_late_confirmation_after_the_lease_sweeper_proves_success(agent, sandbox, frozen):

    from ledger import transitions
    from ledger.providers.base import Confirmed
    from tests.ledger.factories import in_flight

    operation, token = in_flight(agent, OP, lease_seconds=30)
    frozen.shift(31)
    transitions.operation_expire_lease(operation=Operation.objects.get(pk=operation.pk))

    result = executor.persist_outcome(
        transitions.Claim(operation=operation, fencing_token=token),
        Confirmed(result={"id": "eff_late"}, provider_request_id="eff_late"), actor="worker:slow")

    assert result.status == S.SUCCEEDED and result.provider_request_id == "eff_late"
    assert reasons(result)[-1] == "late_confirmation"


def test_late_unknown_after_the_lease_sweeper_changes_nothing(agent, sandbox, frozen):

    from ledger import transitions
    from ledger.providers.base import Unknown
    from tests.ledger.factories import in_flight

    operation, token = in_flight(agent, OP, lease_seconds=30)
    frozen.shift(31)
    transitions.operation_expire_lease(operation=Operation.objects.get(pk=operation.pk))
    events = reasons(operation)

    result = executor.persist_outcome(
        transitions.Claim(operation=operation, fencing_token=token),
        Unknown(error_class="transport.ReadTimeout"), actor="worker:slow")

    # Already unknown for this attempt: idempotent, no second event, no second case.
    assert result.status == S.UNKNOWN
    assert reasons(result) == events == [
        "intent_recorded", "claimed_for_send", "lease_expired"]
