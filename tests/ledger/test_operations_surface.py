"""Credentials command, admin, health, readiness, metrics and deploy checks."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ledger.auth import agent_for_token, hash_token
from ledger.models import AgentCredential, Operation
from tests.conftest import submit_body
from tests.ledger.factories import in_state


def test_create_agent_prints_the_token_once_and_stores_only_its_hash(db):
    out = StringIO()
    call_command("create_agent", "billing-bot", "--tools", "refund,send_email", stdout=out)
    raw = out.getvalue().strip().splitlines()[-1]
    agent = AgentCredential.objects.get(name="billing-bot")
    assert agent.allowed_tools == ["refund", "send_email"]
    assert agent.token_hash == hash_token(raw) and raw not in agent.token_hash
    assert agent_for_token(raw) == agent


def test_create_agent_refuses_unknown_tools_and_writes_nothing(db):
    with pytest.raises(CommandError, match="Unknown tool"):
        call_command("create_agent", "bot", "--tools", "refund,launch_missiles")
    assert not AgentCredential.objects.exists()


@pytest.fixture
def admin_client_logged_in(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw-123456789")
    client.force_login(user)
    return client


def test_admin_lists_operations_with_filters_and_search(admin_client_logged_in, agent):
    in_state(agent, "succeeded", "wf-5:inv-9:refund-1:v1")
    response = admin_client_logged_in.get("/admin/ledger/operation/?status=succeeded&q=inv-9")
    assert response.status_code == 200
    assert b"wf-5:inv-9:refund-1:v1" in response.content


def test_admin_operation_page_shows_status_read_only(admin_client_logged_in, agent):
    operation = in_state(agent, "unknown")
    response = admin_client_logged_in.get(f"/admin/ledger/operation/{operation.pk}/change/")
    assert response.status_code == 200
    assert b'name="status"' not in response.content
    response = admin_client_logged_in.post(
        f"/admin/ledger/operation/{operation.pk}/change/", {"status": "succeeded"})
    assert Operation.objects.get(pk=operation.pk).status == "unknown"


def test_admin_action_expires_leases_through_the_transition(admin_client_logged_in, agent,
                                                             frozen):

    operation = in_state(agent, "in_flight")
    frozen.shift(3600)
    admin_client_logged_in.post("/admin/ledger/operation/", {
        "action": "expire_leases", "_selected_action": [operation.pk]})
    operation.refresh_from_db()
    assert operation.status == "unknown"
    assert operation.events.latest("id").reason == "lease_expired"


def test_health_readiness_and_metrics(client, api, sandbox):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["database"] == "ok"
    api.post("/api/v1/operations", submit_body(), format="json")
    api.post("/api/v1/operations", submit_body(), format="json")
    body = client.get("/metrics").content.decode()
    assert 'ledger_operations_total{outcome="succeeded",tool="refund"}' in body
    assert 'ledger_replays_total{tool="refund"}' in body
    assert "ledger_cases_awaiting_review" in body
    assert "ledger_provider_call_seconds_bucket" in body


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    # The browser tests set DJANGO_ALLOW_ASYNC_UNSAFE for their session; production never does.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"} | {
        "LEDGER_PRODUCTION": "true",
        "DJANGO_SECRET_KEY": "x" * 20 + "-production-secret-for-the-check-" + "y" * 20,
        "DJANGO_ALLOWED_HOSTS": "ledger.example.com",
        "LEDGER_VAR_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_refuses_the_development_secret(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    env |= {"LEDGER_PRODUCTION": "true", "LEDGER_VAR_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode != 0
    assert "ledger.E001" in result.stderr and "development key" in result.stderr


def test_json_logs_carry_the_operation_id_and_nothing_else_from_extra():
    import json
    import logging

    from config.logging import JsonFormatter

    record = logging.LogRecord("ledger", logging.INFO, __file__, 1, "provider send", None, None)
    record.operation_id = "wf-1:inv-1:refund-1:v1"
    record.params = {"payee": "secret person"}
    entry = json.loads(JsonFormatter().format(record))
    assert entry["operation_id"] == "wf-1:inv-1:refund-1:v1"
    assert entry["message"] == "provider send"
    assert "params" not in entry and "secret person" not in json.dumps(entry)


def test_home_page_links_every_audience(client):
    response = client.get("/")
    assert response.status_code == 200
    for path in (b'href="/review/"', b'href="/api/docs/"', b'href="/admin/"'):
        assert path in response.content
