"""An agent that makes the provider call itself: it asks the ledger for a claim, calls the real
sandbox with the key the ledger gave it (the same request shape as the ledger's HTTP adapter),
and reports the outcome."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import refund_params, submit_body

OP = "wf-81:invoice-17:refund-1:v1"


def client_body(operation_id: str = OP, **params: Any) -> dict[str, Any]:
    return submit_body(operation_id, params=refund_params(**params), execution="client")


def claim(api: Any, operation_id: str = OP, **params: Any) -> dict[str, Any]:
    response = api.post("/api/v1/operations", client_body(operation_id, **params), format="json")
    assert response.status_code == 202, response.json()
    return response.json()


def call_provider(sandbox_url: str, resource: dict[str, Any],
                  params: dict[str, Any] | None = None) -> httpx.Response:
    """The agent's own call to the provider, with the ledger's idempotency key."""
    return httpx.post(
        f"{sandbox_url}/v1/effects/refund",
        json={"reference": resource["operation_id"], "params": params or refund_params()},
        headers={"Idempotency-Key": resource["claim"]["idempotency_key"]},
        timeout=5.0,
    )


def report(api: Any, operation_id: str, **body: Any) -> Any:
    return api.post(f"/api/v1/operations/{operation_id}/outcome", body, format="json")


def heartbeat(api: Any, operation_id: str, token: int) -> Any:
    return api.post(f"/api/v1/operations/{operation_id}/heartbeat", {"fencing_token": token},
                    format="json")
