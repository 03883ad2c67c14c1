"""The same reconciler over the other adapters: Stripe's SDK (keys, lookups that are not
authoritative) and SMTP (no keys, lookups by Message-ID in the delivery log)."""

from __future__ import annotations

from ledger import executor
from ledger.models import Operation
from reconciliation.models import Case
from tests.conftest import STRIPE_SMTP_TOOLS, refund_params
from tests.reconciliation.helpers import REFUND_OP, evidence_of, fresh, posts, sweep

S = Operation.Status
EMAIL_OP = "wf-81:customer-7:email-1:v1"


def test_stripe_lost_response_is_resent_with_the_same_key_once(agent, sandbox, settings):
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS
    operation = executor.submit(agent=agent, operation_id=REFUND_OP, tool_name="refund",
                                params=refund_params(memo="sandbox:lose-response")).operation
    assert operation.status == S.UNKNOWN and operation.provider == "stripe-sandbox"

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and case.state == Case.State.RESOLVED
    assert operation.provider_request_id.startswith("re_")
    assert [e.outcome for e in evidence_of(case)] == ["confirmed"]
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_smtp_lost_reply_is_proven_by_the_delivery_log_and_never_resent(
    agent, sandbox, settings
):
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS
    operation = executor.submit(agent=agent, operation_id=EMAIL_OP, tool_name="send_email",
                                params={"to": "cus@example.com", "template": "refund_sent",
                                        "subject": "Your refund",
                                        "body": "sandbox:lose-response"}).operation
    assert operation.status == S.UNKNOWN and operation.provider == "smtp-sandbox"
    sent = posts(sandbox)

    sweep()

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED
    assert [e.kind for e in evidence_of(case)] == ["lookup"]
    assert evidence_of(case)[0].outcome == "found_match"
    assert sandbox.effect_counts() == {EMAIL_OP: 1} and posts(sandbox) == sent


def test_stripe_replayed_500_after_commit_is_settled_by_a_lookup_not_endless_resends(
    agent, sandbox, settings, frozen
):

    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS
    operation = executor.submit(agent=agent, operation_id=REFUND_OP, tool_name="refund",
                                params=refund_params(memo="sandbox:500-after-commit")).operation
    assert operation.status == S.UNKNOWN

    sweep()  # same-key re-send: Stripe replays the stored 500, still ambiguous
    operation, case = fresh(operation)
    assert operation.status == S.UNKNOWN
    assert [(e.kind, e.outcome) for e in evidence_of(case)] == [("resend", "unknown")]

    frozen.move_to(case.next_check_at, tick=False)
    sweep()  # so the next check looks the refund up instead of re-sending again

    operation, case = fresh(operation)
    assert operation.status == S.SUCCEEDED and case.state == Case.State.RESOLVED
    assert [(e.kind, e.outcome) for e in evidence_of(case)] == [
        ("resend", "unknown"), ("lookup", "found_match")]
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_lookup_evidence_names_exactly_what_each_adapter_asked(agent, sandbox,
                                                              stripe_smtp_tools):
    from reconciliation.reconciler import lookup_request
    from tests.conftest import adapter_named
    from tests.ledger.factories import in_state

    operation = in_state(agent, "unknown")
    assert lookup_request(operation, adapter_named("sandbox")) == {
        "provider": operation.provider, "idempotency_key": operation.idempotency_key}
    assert lookup_request(operation, adapter_named("sandbox-nokeys")) == {
        "provider": operation.provider, "reference": operation.operation_id}
    assert lookup_request(operation, adapter_named("stripe-sandbox")) == {
        "provider": operation.provider, "payment_intent": "pi_invoice-17",
        "metadata.operation_id": operation.operation_id}
    smtp = lookup_request(operation, adapter_named("smtp-sandbox"))
    assert smtp["message_id"].startswith(f"<{operation.idempotency_key}@")
