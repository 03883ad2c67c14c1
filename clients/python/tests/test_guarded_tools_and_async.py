"""`@client.tool(...)` and the asyncio client against the live ledger."""

from __future__ import annotations

import inspect

import pytest
from agent_ledger_client import (
    AsyncLedgerClient,
    NotFound,
    Operation,
    ParamsConflict,
    ToolNotAllowed,
    operation_id,
)
from conftest import refund_params


def test_a_guarded_tool_takes_the_signature_plus_a_required_operation_id(client, ledger, unique):
    @client.tool("refund")
    def refund(invoice: str, amount: int, currency: str, payee: str, memo: str = "") -> None:
        """Refund part or all of a paid invoice (amount in minor units)."""

    signature = inspect.signature(refund)
    assert list(signature.parameters) == ["invoice", "amount", "currency", "payee", "memo",
                                          "operation_id"]
    assert signature.parameters["operation_id"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "operation_id" in refund.__doc__ and "tool-call ID" in refund.__doc__
    oid = operation_id(workflow=unique, subject="invoice-40", action="refund", sequence=1)
    first = refund("invoice-40", 2500, "EUR", "cus_123", memo="Damaged", operation_id=oid)
    again = refund(invoice="invoice-40", amount=2500, currency="EUR", payee="cus_123",
                   memo="It arrived broken", operation_id=oid, tool_call_id="call_regen1234")
    assert isinstance(first, Operation) and first.status == "succeeded"
    assert again.replayed and ledger.effect_counts().get(oid) == 1


def test_a_guarded_tool_can_build_its_id_from_the_params(client, ledger, unique):
    @client.tool("refund", returns="model", operation_id=lambda p: operation_id(
        workflow=unique, subject=p["invoice"], action="refund", sequence=1))
    def refund(invoice: str, amount: int, currency: str, payee: str, memo: str = "") -> None:
        """Refund an invoice."""

    assert "operation_id" not in inspect.signature(refund).parameters
    answer = refund("invoice-41", 900, "EUR", "cus_1", memo="first wording")
    replay = refund("invoice-41", 900, "EUR", "cus_1", memo="second wording")
    assert answer["status"] == "succeeded" and replay["replayed"] is True
    assert ledger.effect_counts().get(answer["operation_id"]) == 1


def test_a_guarded_tool_without_an_id_refuses_to_run(client):
    @client.tool("refund")
    def refund(invoice: str, amount: int, currency: str, payee: str) -> None: ...

    with pytest.raises(TypeError, match="operation_id"):
        refund("invoice-42", 1, "EUR", "cus_1")


@pytest.mark.anyio
async def test_async_client_submits_replays_and_reports_conflicts(aclient, ledger, unique):
    oid = operation_id(workflow=unique, subject="invoice-43", action="refund", sequence=1)
    first = await aclient.submit("refund", refund_params("invoice-43"), operation_id=oid)
    again = await aclient.submit("refund", refund_params("invoice-43", memo="reworded"),
                                 operation_id=oid)
    assert (first.http_status, again.http_status, again.replayed) == (201, 200, True)
    with pytest.raises(ParamsConflict) as caught:
        await aclient.submit("refund", refund_params("invoice-43", amount=1), operation_id=oid)
    assert caught.value.differences["amount"] == {"stored": 2500, "submitted": 1}
    assert ledger.effect_counts().get(oid) == 1


@pytest.mark.anyio
async def test_async_wait_returns_on_resolution(aclient, ledger, unique):
    oid = operation_id(workflow=unique, subject="invoice-44", action="refund", sequence=1)
    pending = await aclient.submit("refund", refund_params("invoice-44", memo="sandbox:timeout"),
                                   operation_id=oid)
    assert pending.http_status == 202 and pending.status == "unknown"
    resolved = await aclient.wait(oid, timeout=120)
    assert resolved.status == "succeeded"
    assert ledger.effect_counts().get(oid) == 1


@pytest.mark.anyio
async def test_async_guarded_tool_and_forbidden_tool(ledger, unique):
    async with AsyncLedgerClient(ledger.url, ledger.tokens["narrow"]) as narrow:
        @narrow.tool("refund")
        async def refund(invoice: str, amount: int, currency: str, payee: str) -> None: ...

        oid = operation_id(workflow=unique, subject="invoice-45", action="refund", sequence=1)
        with pytest.raises(ToolNotAllowed):
            await refund("invoice-45", 1, "EUR", "cus_1", operation_id=oid)
        with pytest.raises(NotFound):
            await narrow.get(oid)


def test_the_readme_ten_line_version_runs(ledger, unique):
    from agent_ledger_client import LedgerClient

    token = ledger.token
    # --- as in the README (URL and workflow aside) ---
    ledger_client = LedgerClient(ledger.url, token)

    @ledger_client.tool("refund")
    def refund(invoice: str, amount: int, currency: str, payee: str, memo: str = "") -> None:
        """Refund part or all of a paid invoice (amount in minor units)."""

    oid = operation_id(workflow=unique, subject="invoice-17", action="refund", sequence=1)
    op = refund("invoice-17", 2500, "EUR", "cus_123", memo="Damaged parcel", operation_id=oid)
    # ---
    assert (op.status, op.replayed) == ("succeeded", False)
    assert op.for_model()["operation_id"] == f"{unique}:invoice-17:refund-1:v1"
    ledger_client.close()
