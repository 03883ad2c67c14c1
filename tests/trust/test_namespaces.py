"""Operation IDs live in a namespace per credential; credentials may share one explicitly."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from rest_framework.test import APIClient

from ledger.auth import agent_create
from ledger.models import AgentCredential, Namespace, Operation
from tests.conftest import ALL_TOOLS, refund_params, submit_body

OP = "wf-81:invoice-17:refund-1:v1"


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_each_credential_gets_a_namespace_of_its_own(make_agent):
    first, _ = make_agent("agent-a")
    second, _ = make_agent("agent-b")
    assert first.namespace_id != second.namespace_id
    assert first.namespace.name == "agent/agent-a"


def test_the_same_id_in_two_namespaces_names_two_independent_operations(
    api, second_agent_api, sandbox
):
    first = api.post("/api/v1/operations", submit_body(), format="json")
    other = second_agent_api.post(
        "/api/v1/operations", submit_body(params=refund_params(amount=999)), format="json")

    assert first.status_code == 201 and other.status_code == 201
    # Nothing in the answer says the ID exists elsewhere.
    assert other.json()["value"] == {"amount": 999, "currency": "EUR"}
    rows = Operation.objects.filter(operation_id=OP).order_by("id")
    assert [row.value_amount for row in rows] == [2500, 999]
    assert rows[0].namespace_id != rows[1].namespace_id
    assert rows[0].idempotency_key != rows[1].idempotency_key
    # Each agent reads its own.
    assert api.get(f"/api/v1/operations/{OP}").json()["value"]["amount"] == 2500
    assert second_agent_api.get(f"/api/v1/operations/{OP}").json()["value"]["amount"] == 999


def test_an_id_used_only_in_another_namespace_is_answered_exactly_like_a_fresh_one(
    api, second_agent_api, sandbox
):
    api.post("/api/v1/operations", submit_body(), format="json")
    answer = second_agent_api.get(f"/api/v1/operations/{OP}")
    never_used = second_agent_api.get("/api/v1/operations/wf-0:never:used:v1")

    assert answer.status_code == never_used.status_code == 404
    assert answer.json() == never_used.json()


def test_credentials_of_one_namespace_share_their_operations(db, sandbox):
    _, token_1 = agent_create(name="fleet-worker-1", tools=ALL_TOOLS, namespace="billing")
    _, token_2 = agent_create(name="fleet-worker-2", tools=ALL_TOOLS, namespace="billing")
    worker_1, worker_2 = client_for(token_1), client_for(token_2)

    created = worker_1.post("/api/v1/operations", submit_body(), format="json")
    replay = worker_2.post("/api/v1/operations", submit_body(), format="json")
    changed = worker_2.post("/api/v1/operations",
                            submit_body(params=refund_params(amount=1)), format="json")

    assert created.status_code == 201
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert changed.status_code == 422
    assert changed.json()["differences"]["amount"] == {"stored": 2500, "submitted": 1}
    assert Operation.objects.count() == 1
    assert sandbox.effect_counts() == {OP: 1}
    assert worker_2.get(f"/api/v1/operations/{OP}").status_code == 200
    assert worker_2.get("/api/v1/runs/run-81/operations").json()["count"] == 1


def test_the_database_refuses_a_second_row_with_the_id_in_one_namespace(agent, sandbox):
    from ledger import executor

    executor.submit(agent=agent, operation_id=OP, tool_name="refund", params=refund_params())
    row = Operation.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Operation.objects.create(
            operation_id=OP, agent=agent, namespace=agent.namespace, tool="refund",
            tool_version=1, provider="sandbox", intent_params={}, params={},
            params_hash=row.params_hash, idempotency_key="other-key")


def test_create_agent_joins_an_explicit_namespace(db):
    out = StringIO()
    call_command("create_agent", "w1", "--tools", "refund", "--namespace", "payments", stdout=out)
    call_command("create_agent", "w2", "--tools", "refund", "--namespace", "payments",
                 stdout=StringIO())
    call_command("create_agent", "solo", "--tools", "refund", stdout=StringIO())

    assert "Namespace: payments" in out.getvalue()
    w1, w2, solo = (AgentCredential.objects.get(name=n) for n in ("w1", "w2", "solo"))
    assert w1.namespace_id == w2.namespace_id == Namespace.objects.get(name="payments").pk
    assert solo.namespace.name == "agent/solo"


def test_create_agent_refuses_a_personal_namespace_name(db):
    with pytest.raises(CommandError):
        call_command("create_agent", "w1", "--tools", "refund", "--namespace", "agent/x",
                     stdout=StringIO())
    assert not AgentCredential.objects.exists()


def test_admin_lists_namespaces_and_keeps_a_used_credentials_namespace(
    admin_client, api, agent, sandbox
):
    api.post("/api/v1/operations", submit_body(), format="json")
    listing = admin_client.get("/admin/ledger/namespace/")
    change = admin_client.get(f"/admin/ledger/agentcredential/{agent.pk}/change/")

    assert listing.status_code == 200 and "agent/agent-1" in listing.content.decode()
    assert change.status_code == 200
    assert 'name="namespace"' not in change.content.decode()  # read-only once used
