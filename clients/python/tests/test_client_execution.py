"""Client execution (claim, heartbeat, outcome) and ?wait long-poll against the live ledger."""

from __future__ import annotations

import time

import httpx
import pytest
from agent_ledger_client import (
    LedgerClient,
    ProviderRejected,
    StaleFencingToken,
    operation_id,
)
from conftest import CountingTransport, refund_params


class CardDeclined(Exception):
    """Stands for a provider SDK's definitive rejection exception."""


def _pay(sandbox_url: str, key: str, oid: str, params: dict) -> dict:
    """The agent's own provider call: the sandbox's refund endpoint with the ledger's key."""
    response = httpx.post(f"{sandbox_url}/v1/effects/refund",
                          json={"reference": oid, "params": params},
                          headers={"Idempotency-Key": key}, timeout=10)
    response.raise_for_status()
    return response.json()


def test_reserve_gives_the_key_and_reports_success_on_exit(client, ledger, unique):
    oid = operation_id(workflow=unique, subject="invoice-60", action="refund", sequence=1)
    with client.reserve("refund", refund_params("invoice-60"), operation_id=oid) as op:
        assert op.claimed and op.idempotency_key
        op.result = _pay(ledger.sandbox_url, op.idempotency_key, oid, refund_params("invoice-60"))
        op.provider_reference = str(op.result.get("id", ""))
    assert op.operation.status == "succeeded"
    assert ledger.effect_counts().get(oid) == 1


def test_reserve_of_a_finished_operation_is_a_replay_without_a_claim(client, ledger, unique):
    oid = operation_id(workflow=unique, subject="invoice-61", action="refund", sequence=1)
    with client.reserve("refund", refund_params("invoice-61"), operation_id=oid) as op:
        op.result = _pay(ledger.sandbox_url, op.idempotency_key, oid, refund_params("invoice-61"))
    with client.reserve("refund", refund_params("invoice-61", memo="reworded"),
                        operation_id=oid) as again:
        assert not again.claimed  # nobody may call the provider again
    assert again.operation.status == "succeeded" and again.operation.replayed
    assert ledger.effect_counts().get(oid) == 1


def test_an_exception_in_the_block_reports_unknown_not_failed(client, unique):
    oid = operation_id(workflow=unique, subject="invoice-62", action="refund", sequence=1)
    with pytest.raises(TimeoutError), \
            client.reserve("refund", refund_params("invoice-62"), operation_id=oid) as op:
        raise TimeoutError("the provider did not answer")
    assert op.reported and op.operation.status == "unknown"
    assert client.get(oid).error_class == "TimeoutError"


@pytest.mark.parametrize("raised", [ProviderRejected("card_declined"), CardDeclined()])
def test_a_provider_rejection_reports_failed(client, unique, raised):
    oid = operation_id(workflow=unique, subject=f"invoice-63-{type(raised).__name__}",
                       action="refund", sequence=1)
    with pytest.raises(type(raised)), client.reserve(
            "refund", refund_params("invoice-63"), operation_id=oid,
            rejections=(CardDeclined,)) as op:
        raise raised
    assert op.operation.status == "failed"


def test_heartbeats_extend_the_lease_while_the_block_runs(client, unique):
    oid = operation_id(workflow=unique, subject="invoice-64", action="refund", sequence=1)
    with client.reserve("refund", refund_params("invoice-64"), operation_id=oid,
                        heartbeat_interval=0.3) as op:
        first_expiry = op.claim.lease_expires_at
        time.sleep(1.2)
        assert op.heartbeats >= 2 and op.claim.lease_expires_at > first_expiry
        op.result = {"id": "manual"}
    assert op.operation.status == "succeeded"


def test_a_stale_fencing_token_is_refused(client, unique):
    oid = operation_id(workflow=unique, subject="invoice-65", action="refund", sequence=1)
    with client.reserve("refund", refund_params("invoice-65"), operation_id=oid) as op:
        token = op.fencing_token
        op.result = {"id": "done"}
    with pytest.raises(StaleFencingToken) as caught:  # a token that does not hold the claim
        client.report_outcome(oid, token + 1, "succeeded", result={"id": "late"})
    assert caught.value.status == 409 and caught.value.code == "stale_fencing_token"


def test_guarded_tool_with_client_execution_runs_the_body_once(client, ledger, unique):
    calls = []

    @client.tool("refund", execution="client")
    def refund(invoice: str, amount: int, currency: str, payee: str, memo: str = "", *,
               idempotency_key: str) -> dict:
        calls.append(idempotency_key)
        return {"id": f"re_{invoice}"}

    oid = operation_id(workflow=unique, subject="invoice-66", action="refund", sequence=1)
    first = refund("invoice-66", 100, "EUR", "cus_1", memo="a", operation_id=oid)
    again = refund("invoice-66", 100, "EUR", "cus_1", memo="b", operation_id=oid)
    assert first.status == "succeeded" and again.replayed and len(calls) == 1


def test_wait_long_polls_when_the_ledger_holds_the_answer(ledger, unique):
    transport = CountingTransport()
    with LedgerClient(ledger.url, ledger.token, transport=transport) as client:
        oid = operation_id(workflow=unique, subject="invoice-67", action="refund", sequence=1)
        client.submit("refund", refund_params("invoice-67"), operation_id=oid,
                      execution="async")
        assert client.wait(oid, timeout=120).status == "succeeded"
    reads = [r for r in transport.requests if r.method == "GET"]
    assert len(reads) <= 3  # held by the server, not polled every Retry-After
