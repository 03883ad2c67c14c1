"""What one provider answer proves (pure functions, no I/O)."""

from __future__ import annotations

import pytest

from ledger.models import Operation
from ledger.providers.base import Found, NotFound, Unavailable
from ledger.tools import get_tool
from reconciliation.reconciler import contradicts, judge_lookup

S = Operation.Status
INTENT = {"invoice": "invoice-17", "amount": 2500, "currency": "EUR", "payee": "cus_123"}


def operation() -> Operation:
    return Operation(operation_id="wf-1:inv-17:refund-1:v1", tool="refund",
                     intent_params=dict(INTENT))


def found(status: str = "succeeded", matches: int = 1, **changes: object) -> Found:
    fields = {**INTENT, "memo": "rephrased freely", "reference": "wf-1:inv-17:refund-1:v1",
              **changes}
    return Found(fields=fields, provider_request_id="eff_1", status=status, matches=matches)


@pytest.mark.parametrize(("answer", "outcome", "proves_success", "anomaly"), [
    (found(), "found_match", True, False),
    (found(amount=2600), "found_mismatch", False, True),
    (found(payee="cus_999"), "found_mismatch", False, True),
    (found(currency="USD"), "found_mismatch", False, True),
    (found(invoice="invoice-18"), "found_mismatch", False, True),
    (found(reference="someone-else"), "found_mismatch", False, True),
    (found(matches=2), "found_multiple", False, True),
    (found(status="failed"), "found_not_succeeded", False, True),
    (found(status="pending"), "found_pending", False, False),
    (NotFound(), "not_found", False, False),
    (Unavailable(error_class="http_503"), "unavailable", False, False),
])
def test_every_intent_field_the_reference_and_the_status_must_match(
    answer, outcome, proves_success, anomaly
):
    verdict = judge_lookup(operation(), get_tool("refund"), answer, absence_is_proof=False)
    assert (verdict.outcome, verdict.proves_success, verdict.anomaly) == (
        outcome, proves_success, anomaly)
    assert not verdict.proves_absence


def test_not_found_proves_absence_only_when_the_window_closed_on_an_authoritative_provider():
    tool = get_tool("refund")
    assert judge_lookup(operation(), tool, NotFound(), absence_is_proof=True).proves_absence
    assert not judge_lookup(operation(), tool, NotFound(), absence_is_proof=False).proves_absence


def test_the_memo_is_not_an_intent_field():
    verdict = judge_lookup(operation(), get_tool("refund"), found(memo="other words"),
                           absence_is_proof=False)
    assert verdict.proves_success and verdict.differences == {}


@pytest.mark.parametrize(("resolved_as", "send_outcome", "contradiction"), [
    (S.SUCCEEDED, "Confirmed", False),
    (S.SUCCEEDED, "Rejected", True),
    (S.SUCCEEDED, "Unknown", False),
    (S.FAILED, "Confirmed", True),
    (S.FAILED, "Rejected", False),
    (S.FAILED, "NotSent", False),
])
def test_what_contradicts_a_resolution(resolved_as, send_outcome, contradiction):
    assert contradicts(resolved_as=resolved_as, send_outcome=send_outcome) is contradiction
