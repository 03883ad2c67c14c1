"""Catalogue tools and client execution: a tool whose connector is lookup-only is guarded and
reconciled like any other, and a tool whose entry says client_execution = false is refused."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from ledger.models import Operation
from reconciliation import services
from reconciliation.models import Case
from tests.catalogue.conftest import ACME_TOKEN
from tests.conftest import CATALOGUES
from tests.reconciliation.helpers import sweep

S = Operation.Status
OP = "wf-9:inv-2026-17:transfer-1:v1"
TRANSFER = {"supplier": "sup_42", "invoice": "inv-2026-17", "amount_minor": 12_500,
            "currency": "EUR"}


@pytest.fixture
def client_only(settings: Any, monkeypatch: pytest.MonkeyPatch, sandbox: Any,
                sandbox_server: Any, make_agent: Any) -> APIClient:
    monkeypatch.setenv("ACME_PAYOUTS_URL", sandbox_server.url)
    monkeypatch.setenv("ACME_PAYOUTS_TOKEN", ACME_TOKEN)
    settings.LEDGER_TOOLS_FILE = str(CATALOGUES / "client_only.toml")
    _, token = make_agent("treasury-bot", tools=("bank_transfer", "treasury_sweep"))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


def test_a_lookup_only_tool_is_claimed_by_the_client_and_proven_by_lookup(
    client_only, sandbox, sandbox_server, frozen
):
    response = client_only.post("/api/v1/operations", {
        "operation_id": OP, "tool": "bank_transfer", "params": TRANSFER,
        "execution": "client"}, format="json")
    assert response.status_code == 202
    claim = response.json()["claim"]
    # The agent's own service makes the transfer with the ledger's key, then dies.
    sent = httpx.post(f"{sandbox_server.url}/generic/transfers", json={
        "reference": OP, "supplier": "sup_42", "invoice": "inv-2026-17", "amount": 12_500,
        "currency": "EUR"}, headers={"Idempotency-Key": claim["idempotency_key"],
                                     "Authorization": ACME_TOKEN})
    assert sent.status_code == 201
    frozen.shift(31)
    sandbox.advance_clock(31)
    assert services.sweep_expired_leases() == 1

    sweep()

    operation = Operation.objects.get()
    case = Case.objects.get()
    assert operation.status == S.SUCCEEDED, (case.state, case.review_reason, [
        (e.kind, e.outcome, e.request, e.response) for e in case.evidence.all()])
    assert Case.objects.get().state == Case.State.RESOLVED
    assert sandbox.effect_counts() == {OP: 1}


def test_a_tool_whose_entry_forbids_client_execution_is_refused(client_only, sandbox):
    response = client_only.post("/api/v1/operations", {
        "operation_id": "wf-9:acc_main:sweep-1:v1", "tool": "treasury_sweep",
        "params": {"account": "acc_main", "amount_minor": 100}, "execution": "client"},
        format="json")

    assert response.status_code == 400 and "execution" in response.json()["errors"]
    assert not Operation.objects.exists()
    assert sandbox.request_counts()["total"] == 0
