"""DESIGN §4.3's performance rule, enforced by counting: two commits for a fresh action, one
read of the operation plus authentication for a replay."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger import versions
from ledger.tools import get_tool
from tests.conftest import submit_body


@pytest.mark.django_db(transaction=True)
def test_fresh_action_costs_two_commits_besides_the_provider_call(api, sandbox):
    api.get("/api/v1/operations/warm:up")  # authenticate once so last_used_at is fresh
    # The process records each tool version once (its first use), not per request.
    versions.ensure_recorded(get_tool("refund"))
    with mock.patch.object(connection, "commit", wraps=connection.commit) as commit:
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 201
    assert commit.call_count == 2


@pytest.mark.django_db(transaction=True)
def test_replay_costs_one_read_of_the_operation_plus_authentication(api, sandbox):
    api.post("/api/v1/operations", submit_body(), format="json")
    with (
        mock.patch.object(connection, "commit", wraps=connection.commit) as commit,
        CaptureQueriesContext(connection) as queries,
    ):
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 200
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 2, statements
    assert "ledger_agentcredential" in statements[0]
    assert "ledger_operation" in statements[1] and statements[1].startswith("SELECT")
    assert commit.call_count == 0


@pytest.mark.django_db(transaction=True)
def test_get_of_a_terminal_operation_costs_the_same(api, sandbox):
    api.post("/api/v1/operations", submit_body(), format="json")
    with CaptureQueriesContext(connection) as queries:
        response = api.get("/api/v1/operations/wf-81:invoice-17:refund-1:v1")
    assert response.status_code == 200
    assert len(queries.captured_queries) == 2
