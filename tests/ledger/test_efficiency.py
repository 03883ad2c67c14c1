"""DESIGN §4.3's performance rule and issue 10's budget, counted where it matters.

On PostgreSQL the counts are what the server receives: libpq's protocol trace of the Django
connection (every simple Query and every extended-protocol Execute is a statement; BEGIN, COMMIT
and SAVEPOINT would show up as Query messages) and, for commits, the transaction IDs PostgreSQL
stamped on the rows the action wrote (xmin): each distinct ID is one committed write
transaction. On SQLite (the embedded default) Django's own commit calls are counted.
"""

from __future__ import annotations

import datetime as dt
import re
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger import executor, outbox, serializers, versions, webhooks
from ledger.auth import agent_revoke, credential_cache
from ledger.models import (
    AgentCredential,
    Operation,
    OperationEvent,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from ledger.serializers import OperationSerializer, operation_resource
from ledger.tools import get_tool
from tests.conftest import refund_params, requires_postgres, submit_body
from tests.ledger import factories

OPERATION_ID = "wf-81:invoice-17:refund-1:v1"


@dataclass
class Wire:
    """Frontend messages the PostgreSQL server received while tracing."""

    statements: list[str] = field(default_factory=list)
    # Transaction status after each statement (ReadyForQuery): I = idle, so that statement
    # ended a transaction (autocommit, or a COMMIT); T = still inside one.
    ready: list[str] = field(default_factory=list)

    @property
    def transaction_control(self) -> list[str]:
        return [s for s in self.statements
                if re.match(r'"?(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)', s, re.I)]


@contextmanager
def on_the_wire() -> Iterator[Wire]:
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    wire = Wire()
    with tempfile.TemporaryFile("w+") as log:
        pgconn.trace(log.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield wire
        finally:
            pgconn.untrace()
            log.flush()
            log.seek(0)
            parsed: dict[str, str] = {}  # prepared statement name → its SQL
            bound = ""
            for line in log:
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 3:
                    continue
                direction, kind, rest = parts[0], parts[2], "\t".join(parts[3:]).strip()
                if direction == "F" and kind == "Query":
                    wire.statements.append(rest)
                elif direction == "F" and kind == "Parse":
                    name, _, sql = rest.partition(" ")
                    parsed[name] = sql
                elif direction == "F" and kind == "Bind":
                    bound = parsed.get(rest.split(" ")[1], "")  # Bind "<portal>" "<statement>"
                elif direction == "F" and kind == "Execute":
                    # a prepared statement parsed before tracing began shows no SQL
                    wire.statements.append(bound or "(prepared earlier)")
                elif direction == "B" and kind == "ReadyForQuery":
                    wire.ready.append(rest)


def write_transactions(operation_id: str) -> int:
    """Distinct transaction IDs on the operation row and its event rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT x) FROM ("
            " SELECT o.xmin::text AS x FROM ledger_operation o WHERE o.operation_id = %s"
            " UNION ALL SELECT e.xmin::text FROM ledger_operationevent e"
            " JOIN ledger_operation o ON o.id = e.operation_id WHERE o.operation_id = %s) t",
            [operation_id, operation_id])
        return int(cursor.fetchone()[0])


def warm(api: Any) -> None:
    """One authenticated request, so the credential is cached and last_used_at is fresh; the
    process records each tool version once (its first use), not per request."""
    api.get("/api/v1/operations/warm:up")
    versions.ensure_recorded(get_tool("refund"))


# --- PostgreSQL: what the server receives ----------------------------------------------------

@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_fresh_action_is_two_write_transactions_without_savepoints_on_the_wire(api, sandbox):
    warm(api)
    with on_the_wire() as wire:
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 201
    # The lookup is the same prepared statement as warm()'s read (both by namespace and ID).
    assert wire.statements[0].lstrip('"').startswith(("SELECT", "(prepared earlier)"))
    assert "INSERT INTO" in wire.statements[1] and "ON CONFLICT" in wire.statements[1]
    # The lookup; the intent recorded already claimed with both events; the fenced outcome
    # with its event and its webhook outbox rows. Each one autocommit statement: no
    # BEGIN/COMMIT/SAVEPOINT.
    assert wire.transaction_control == [], wire.statements
    assert len(wire.statements) <= 5, wire.statements
    assert set(wire.ready[-1:]) == {"I"}
    assert write_transactions(OPERATION_ID) == 2
    reasons = list(Operation.objects.get(operation_id=OPERATION_ID).events.values_list(
        "reason", "from_status", "to_status", "fencing_token"))
    assert reasons == [("intent_recorded", "", "prepared", 0),
                       ("claimed_for_send", "prepared", "in_flight", 1),
                       ("provider_confirmed", "in_flight", "succeeded", 1)]


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_rejected_fresh_action_is_also_two_write_transactions(api, sandbox):
    warm(api)
    body = submit_body(params=refund_params(memo="sandbox:reject"))
    with on_the_wire() as wire:
        response = api.post("/api/v1/operations", body, format="json")
    assert response.status_code == 201 and response.json()["status"] == "failed"
    assert wire.transaction_control == [] and len(wire.statements) <= 5, wire.statements
    assert write_transactions(OPERATION_ID) == 2


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_replay_over_the_api_is_one_statement_with_a_cached_credential(api, sandbox):
    api.post("/api/v1/operations", submit_body(), format="json")
    with on_the_wire() as wire, CaptureQueriesContext(connection) as queries:
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 200 and response["Idempotent-Replayed"] == "true"
    assert len(wire.statements) == 1, wire.statements
    sql = wire.statements[0]
    if sql == "(prepared earlier)":  # the fresh call prepared it: Django's log names it
        sql = queries.captured_queries[-1]["sql"]
    assert "ledger_operation" in sql and "ORDER BY" not in sql and "LIMIT" not in sql


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_replay_with_an_expired_credential_cache_is_two_statements(api, sandbox, frozen):
    api.post("/api/v1/operations", submit_body(), format="json")
    frozen.shift(5)  # past LEDGER_CREDENTIAL_CACHE_SECONDS, inside last_used_at's resolution
    with on_the_wire() as wire:
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 200
    assert len(wire.statements) == 2, wire.statements
    assert "ledger_agentcredential" in wire.statements[0]  # Django's own (literal) query


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_replay_in_process_is_one_statement(agent, sandbox):
    executor.submit(agent=agent, operation_id=OPERATION_ID, tool_name="refund",
                    params=refund_params())
    with on_the_wire() as wire:
        submission = executor.submit(agent=agent, operation_id=OPERATION_ID, tool_name="refund",
                                     params=refund_params())
    assert submission.disposition is executor.Disposition.REPLAYED
    assert len(wire.statements) == 1 and wire.transaction_control == []


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_get_of_a_terminal_operation_is_one_statement(api, sandbox):
    api.post("/api/v1/operations", submit_body(), format="json")
    with on_the_wire() as wire:
        response = api.get(f"/api/v1/operations/{OPERATION_ID}")
    assert response.status_code == 200
    assert len(wire.statements) == 1, wire.statements


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_request_sends_no_health_check_ping(api, sandbox):
    api.post("/api/v1/operations", submit_body(), format="json")
    with on_the_wire() as wire:
        api.get(f"/api/v1/operations/{OPERATION_ID}")
        api.get(f"/api/v1/operations/{OPERATION_ID}")
    assert not any(s.strip('"').upper().startswith("SELECT 1") for s in wire.statements)
    assert len(wire.statements) == 2


# --- any database ----------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_fresh_action_costs_two_commits_besides_the_provider_call(api, sandbox):
    warm(api)
    if connection.vendor == "postgresql":
        # Autocommit statements: Django never calls commit(); the wire tests above count them.
        with on_the_wire() as wire:
            api.post("/api/v1/operations", submit_body(), format="json")
        assert write_transactions(OPERATION_ID) == 2
        assert not [s for s in wire.transaction_control if "SAVEPOINT" in s]
        return
    with mock.patch.object(connection, "commit", wraps=connection.commit) as commit:
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 201
    assert commit.call_count == 2


@pytest.mark.django_db(transaction=True)
def test_replay_costs_one_read_of_the_operation(api, sandbox):
    api.post("/api/v1/operations", submit_body(), format="json")
    with (
        mock.patch.object(connection, "commit", wraps=connection.commit) as commit,
        CaptureQueriesContext(connection) as queries,
    ):
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 200
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 1, statements
    assert "ledger_operation" in statements[0] and statements[0].startswith("SELECT")
    assert commit.call_count == 0


@pytest.mark.django_db(transaction=True)
def test_revocation_in_this_process_takes_effect_at_once(api, agent, sandbox):
    warm(api)
    agent_revoke(agent=agent)
    response = api.get(f"/api/v1/operations/{OPERATION_ID}")
    assert response.status_code == 401


@pytest.mark.django_db(transaction=True)
def test_revocation_in_another_process_takes_effect_within_the_cache_window(
    api, agent, sandbox, frozen, settings
):
    settings.LEDGER_CREDENTIAL_CACHE_SECONDS = 2.0
    warm(api)
    # Another process revokes it: a bare UPDATE, no signal reaches this process's cache.
    AgentCredential.objects.filter(pk=agent.pk).update(is_active=False)
    assert api.get(f"/api/v1/operations/{OPERATION_ID}").status_code == 404  # cached, briefly
    frozen.shift(2.1)
    assert api.get(f"/api/v1/operations/{OPERATION_ID}").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_a_bad_token_is_never_cached(api, agent, sandbox):
    bad = APIClientWith("al_deadbeef_not-a-real-token")
    for _ in range(2):
        with CaptureQueriesContext(connection) as queries:
            assert bad.get(f"/api/v1/operations/{OPERATION_ID}").status_code == 401
        assert len(queries.captured_queries) == 1
    assert credential_cache.get("anything") is None


def APIClientWith(token: str) -> Any:  # noqa: N802 (reads like the class it builds)
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.mark.django_db(transaction=True)
def test_api_calls_with_a_bearer_token_skip_session_and_messages(api, sandbox, client):
    response = api.get(f"/api/v1/operations/{OPERATION_ID}")
    assert "Cookie" not in response.get("Vary", "")
    assert "sessionid" not in response.cookies
    # Pages still get the whole middleware stack (a session and CSRF for the admin login).
    login = client.get("/admin/login/")
    assert login.status_code == 200 and "csrftoken" in login.cookies


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["prepared", "in_flight", "succeeded", "failed", "unknown"])
def test_the_resource_renders_exactly_as_the_serializer_does(agent, status, rf):
    operation = factories.in_state(agent, status)
    request = rf.get("/api/v1/operations/x")
    for fresh in (Operation.objects.get(pk=operation.pk),
                  Operation.objects.select_related("reconciliation_case").get(pk=operation.pk)):
        expected = OperationSerializer(fresh, context={"request": request}).data
        assert operation_resource(fresh, request=request) == expected


@pytest.fixture
def endpoint(agent) -> Iterator[WebhookEndpoint]:
    """An active webhook endpoint for the agent (a port nobody listens on: delivery is not what
    these tests look at, and a delivery task enqueued here only reaches the test broker)."""
    endpoint, _ = webhooks.endpoint_create(agent=agent, url="http://127.0.0.1:9/hooks")
    yield endpoint


def outbox_rows(operation_id: str) -> list[tuple[str, int]]:
    """(event type, deliveries) of the operation's webhook events."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT w.type, count(d.id) FROM ledger_webhookevent w"
            " JOIN ledger_operation o ON o.id = w.operation_id"
            " LEFT JOIN ledger_webhookdelivery d ON d.event_id = w.id"
            " WHERE o.operation_id = %s GROUP BY w.id, w.type ORDER BY w.id", [operation_id])
        return [(kind, int(n)) for kind, n in cursor.fetchall()]


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_the_webhook_outbox_rows_go_out_in_the_outcomes_one_statement(api, sandbox, endpoint):
    warm(api)
    with on_the_wire() as wire:
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 201
    assert len(wire.statements) <= 5 and wire.transaction_control == [], wire.statements
    assert outbox_rows(OPERATION_ID) == [("operation.succeeded", 1)]
    with connection.cursor() as cursor:
        # The outcome's commit wrote the status change, its event, the webhook event and its
        # delivery: one transaction ID on all four.
        cursor.execute(
            "SELECT count(DISTINCT x) FROM ("
            " SELECT o.xmin::text AS x FROM ledger_operation o WHERE o.operation_id = %s"
            " UNION ALL SELECT e.xmin::text FROM ledger_operationevent e"
            "  JOIN ledger_operation o ON o.id = e.operation_id"
            "  WHERE o.operation_id = %s AND e.to_status = 'succeeded'"
            " UNION ALL SELECT w.xmin::text FROM ledger_webhookevent w"
            "  JOIN ledger_operation o ON o.id = w.operation_id WHERE o.operation_id = %s"
            " UNION ALL SELECT d.xmin::text FROM ledger_webhookdelivery d"
            "  JOIN ledger_webhookevent w ON w.id = d.event_id"
            "  JOIN ledger_operation o ON o.id = w.operation_id WHERE o.operation_id = %s) t",
            [OPERATION_ID] * 4)
        assert cursor.fetchone()[0] == 1
    assert write_transactions(OPERATION_ID) == 2


@pytest.mark.django_db(transaction=True)
def test_a_fresh_outcome_writes_its_webhook_event_and_deliveries(api, sandbox, endpoint, agent):
    removed, _ = webhooks.endpoint_create(agent=agent, url="http://127.0.0.1:9/removed")
    webhooks.endpoint_remove(endpoint=removed)
    warm(api)
    with mock.patch.object(connection, "commit", wraps=connection.commit) as commit:
        response = api.post("/api/v1/operations", submit_body(), format="json")
    assert response.status_code == 201
    operation = Operation.objects.get(operation_id=OPERATION_ID)
    event = WebhookEvent.objects.get()
    assert event.type == "operation.succeeded" and event.operation_id == operation.pk
    assert event.event_id.startswith("evt_")
    assert event.operation_event == operation.events.get(to_status="succeeded")
    payload = outbox.event_payload(event)
    urls = {"url", "status_url"}  # relative in the payload unless LEDGER_PUBLIC_BASE_URL is set
    assert ({k: v for k, v in payload["data"].items() if k not in urls}
            == {k: v for k, v in response.json().items() if k not in urls})
    assert payload["data"]["status"] == "succeeded"
    # The body (on PostgreSQL rendered from the row the statement left) is what the general
    # path stores: the type, when, and the operation as the change left it.
    assert set(payload) == {"type", "timestamp", "data"}
    assert payload["type"] == "operation.succeeded"
    assert payload["data"] == outbox.operation_resource(operation)
    if connection.vendor == "postgresql":  # one statement wrote both, with one `now`
        assert payload["timestamp"] == serializers.iso_datetime(event.created_at)
        assert event.payload is None
        assert not set(outbox.SNAPSHOT_OMITS) & set(event.operation_snapshot)
    assert list(WebhookDelivery.objects.values_list("endpoint_id", "status", "attempts")) == [
        (endpoint.pk, "pending", 0)]
    if connection.vendor == "postgresql":
        assert write_transactions(OPERATION_ID) == 2
    else:
        assert commit.call_count == 2


@pytest.mark.django_db(transaction=True)
def test_a_rejected_fresh_outcome_announces_operation_failed(api, sandbox, endpoint):
    warm(api)
    body = submit_body(params=refund_params(memo="sandbox:reject"))
    assert api.post("/api/v1/operations", body, format="json").json()["status"] == "failed"
    assert list(WebhookEvent.objects.values_list("type", flat=True)) == ["operation.failed"]
    assert WebhookDelivery.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_first_outcomes_body_is_the_operation_as_that_change_left_it(
        api, sandbox, endpoint, client, django_user_model):
    """On PostgreSQL the statement that writes the outcome keeps the row it left (less its
    params) and the body is rendered from it when read: every column comes back as stored, and a
    later change to the operation does not change what the event says."""
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement outcome (and its snapshot) is PostgreSQL's")
    warm(api)
    assert api.post("/api/v1/operations", submit_body(), format="json").status_code == 201
    operation = Operation.objects.get(operation_id=OPERATION_ID)
    event = WebhookEvent.objects.get()
    assert event.payload is None
    assert set(event.operation_snapshot) == {
        f.column for f in Operation._meta.concrete_fields} - set(outbox.SNAPSHOT_OMITS)
    kept = outbox.operation_from_snapshot(event.operation_snapshot)
    for column in Operation._meta.concrete_fields:
        if column.column not in outbox.SNAPSHOT_OMITS:
            assert getattr(kept, column.attname) == getattr(operation, column.attname), column.name
    as_left = outbox.operation_resource(operation)

    Operation.objects.filter(pk=operation.pk).update(subject="changed later",
                                                     updated_at=timezone.now())

    payload = outbox.event_payload(WebhookEvent.objects.get())
    assert payload["data"] == as_left and payload["data"]["subject"] != "changed later"
    assert WebhookEvent.objects.get().payload is None  # read, never rewritten (append-only)
    # Staff see the body as it is sent, not the snapshot.
    client.force_login(django_user_model.objects.create_superuser("ops", "o@example.com", "pw"))
    page = client.get(f"/admin/ledger/webhookevent/{event.pk}/change/").content.decode()
    assert "Body sent" in page and "&quot;operation.succeeded&quot;" in page
    assert f"&quot;status_url&quot;: &quot;{as_left['status_url']}&quot;" in page
    assert "changed later" not in page and "lease_owner" not in page  # never the snapshot


@pytest.mark.django_db(transaction=True)
def test_a_stale_fresh_outcome_writes_no_outbox_rows(agent, sandbox, endpoint):
    """The fenced statement matched nothing (the lease was taken over): neither the change, its
    event nor a webhook for it is written, and the in-memory row is left as it was."""
    from ledger import transitions

    operation, claim = transitions.operation_record_and_claim(
        agent=agent, values=factories.row_values(OPERATION_ID), worker="w", lease_seconds=60)
    assert claim is not None
    Operation.objects.filter(pk=operation.pk).update(fencing_token=2)  # someone else's claim
    done = transitions._finish_new(
        operation, fencing_token=1, to_status=Operation.Status.SUCCEEDED, actor="w",
        reason="provider_confirmed", data=None, fields={"result": {}, "error_class": ""})
    assert done is None and operation.status == Operation.Status.IN_FLIGHT
    assert not WebhookEvent.objects.exists() and not WebhookDelivery.objects.exists()
    assert list(operation.events.values_list("to_status", flat=True)) == ["prepared",
                                                                          "in_flight"]


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_each_hot_statement_keeps_its_cursor_until_the_connection_is_replaced(
        agent, sandbox, monkeypatch):
    """psycopg reuses a cursor's adaptation context only for the query it ran last, so the hot
    path keeps a cursor per statement text: the same three serve every fresh action and its
    replay, a new connection gets new ones, and the number kept is bounded."""
    from ledger import rows

    def submit(n: int) -> executor.Disposition:
        return executor.submit(agent=agent, operation_id=f"wf:cursors:refund-{n}:v1",
                               tool_name="refund", params=refund_params()).disposition

    assert submit(1) == executor.Disposition.CREATED
    kept = dict(connection._ledger_hot_cursors)
    assert len(kept) == 3  # the lookup, the insert already claimed, the fenced outcome
    assert submit(2) == executor.Disposition.CREATED
    assert submit(2) == executor.Disposition.REPLAYED
    assert {sql: entry[1] for sql, entry in connection._ledger_hot_cursors.items()} == {
        sql: entry[1] for sql, entry in kept.items()}

    connection.close()
    assert submit(3) == executor.Disposition.CREATED
    assert connection._ledger_hot_raw is connection.connection
    assert all(entry[1].connection is connection.connection
               for entry in connection._ledger_hot_cursors.values())
    assert not {id(e[1]) for e in kept.values()} & {
        id(e[1]) for e in connection._ledger_hot_cursors.values()}

    monkeypatch.setattr(rows, "HOT_CURSORS", 2)
    connection.close()
    assert submit(4) == executor.Disposition.CREATED
    assert submit(4) == executor.Disposition.REPLAYED
    assert len(connection._ledger_hot_cursors) <= 2
    assert Operation.objects.filter(operation_id__startswith="wf:cursors:",
                                    status="succeeded").count() == 4


@pytest.mark.parametrize("body", [
    submit_body(),
    submit_body(execution="async", customer_ref="  cust-9  "),
    {"operation_id": "wf:1:refund-1:v1", "tool": "refund", "params": {}},
    submit_body(run_id=""),
    submit_body(run_id=17),
    submit_body(tool_call_id=None),
    submit_body(operation_id="x" * 500),
    submit_body(tool="ref\x00und"),
    submit_body(customer_ref="\ud800"),
    submit_body(execution="later"),
    submit_body(execution=1),
    submit_body(params=[1, 2]),
    {"tool": "refund", "params": {}},
    ["not", "an", "object"],
])
def test_the_fast_submit_check_accepts_exactly_what_the_serializer_accepts(body):
    from ledger.serializers import OperationSubmitSerializer, submit_fields_fast

    fast = submit_fields_fast(body)
    serializer = OperationSubmitSerializer(data=body)
    if fast is None:
        return  # the API validates with the serializer itself: same answer by construction
    assert serializer.is_valid(), serializer.errors
    assert fast == dict(serializer.validated_data)


def test_plain_valid_bodies_take_the_fast_path():
    from ledger.serializers import submit_fields_fast

    assert submit_fields_fast(submit_body()) is not None
    assert submit_fields_fast(submit_body(execution="async")) is not None


@pytest.mark.django_db
def test_the_throttle_counts_in_a_window_that_reopens_a_period_later(api, frozen):
    from django.core.cache import cache

    from ledger.auth import AgentRateThrottle

    cache.clear()
    original = AgentRateThrottle.THROTTLE_RATES
    AgentRateThrottle.THROTTLE_RATES = {**original, "agent": "2/min"}
    try:
        codes = [api.get(f"/api/v1/operations/{OPERATION_ID}") for _ in range(3)]
        frozen.shift(20)
        still = api.get(f"/api/v1/operations/{OPERATION_ID}")
        frozen.shift(41)
        reopened = api.get(f"/api/v1/operations/{OPERATION_ID}")
    finally:
        AgentRateThrottle.THROTTLE_RATES = original
        cache.clear()
    assert [r.status_code for r in codes] == [404, 404, 429]
    assert int(codes[2]["Retry-After"]) == 60
    assert still.status_code == 429 and int(still["Retry-After"]) == 40
    assert reopened.status_code == 404


@pytest.mark.parametrize("operation_id", [
    OPERATION_ID, "a:b", "wf 1:x", "x%2Fy", "caf\u00e9:1", "!$&'()*+,;=~@", "q?x#y",
])
def test_resource_urls_are_built_exactly_as_reverse_builds_them(operation_id):
    from django.urls import reverse, set_script_prefix

    from ledger.serializers import url_with_arg

    for prefix in ("/", "/ledger/"):
        set_script_prefix(prefix)
        try:
            assert url_with_arg("api:operation-detail", operation_id) == reverse(
                "api:operation-detail", args=[operation_id])
            assert url_with_arg("portal:status", "abc123") == reverse("portal:status",
                                                                      args=["abc123"])
        finally:
            set_script_prefix("/")


@pytest.mark.parametrize("operation_id", [
    OPERATION_ID, "a:b", "wf 1:x", "x%2Fy", "caf\u00e9:1", "!$&'()*+,;=~@", "q?x#y",
])
@pytest.mark.parametrize(("host", "secure"), [("127.0.0.1:8000", False), ("testserver", True)])
def test_absolute_resource_urls_are_what_build_absolute_uri_gives(operation_id, host, secure,
                                                                  settings):
    from django.test import RequestFactory

    from ledger.serializers import absolute_url, url_with_arg

    settings.ALLOWED_HOSTS = ["127.0.0.1", "testserver"]
    for path in (url_with_arg("api:operation-detail", operation_id),
                 url_with_arg("portal:status", "abc123"), "//evil.example/x", "relative"):
        request = RequestFactory().get("/", HTTP_HOST=host, secure=secure)
        first, second = absolute_url(request, path), absolute_url(request, path)
        assert first == second == request.build_absolute_uri(path)


@requires_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime")
def test_the_hot_paths_parameter_shortcut_agrees_with_get_db_prep_save(api, sandbox, endpoint):
    """rows.prep_save passes plain values through on PostgreSQL; for every column the hot path
    writes, with the values a real fresh action wrote (and the awkward ones: None, a naive
    datetime, a bool or a str where an integer goes), it gives what get_db_prep_save gives."""
    import datetime as dt

    from django.core.exceptions import ValidationError

    from ledger import rows
    from ledger.models import OperationEvent

    assert api.post("/api/v1/operations", submit_body(), format="json").status_code == 201
    operation = Operation.objects.get(operation_id=OPERATION_ID)
    samples = [operation, *operation.events.all(), *WebhookEvent.objects.all(),
               *WebhookDelivery.objects.all()]
    assert {type(s) for s in samples} == {Operation, OperationEvent, WebhookEvent,
                                          WebhookDelivery}
    awkward = [None, dt.datetime(2026, 11, 30, 12, 0), True, "7", 7, "text",
               dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC), {"a": [1, "b"]}, [{"c": None}],
               [], {}, Operation.Status.SUCCEEDED, Operation.Execution.CLIENT]
    checked = 0
    for sample in samples:
        for column in type(sample)._meta.concrete_fields:
            shortcut = rows.prep_save(column, "postgresql")
            for value in [getattr(sample, column.attname), *awkward]:
                try:
                    expected = column.get_db_prep_save(value, connection)
                except (TypeError, ValueError, ValidationError):
                    continue  # a value this column cannot take at all
                got = shortcut(value, connection)
                assert type(got) is type(expected), (column, value)
                # psycopg's Jsonb wrapper has no equality of its own: compare what it wraps
                # and what it will be encoded with.
                assert getattr(got, "obj", got) == getattr(expected, "obj", expected), (
                    column, value)
                if hasattr(expected, "obj") and not isinstance(value, dt.datetime):
                    assert got.dumps(got.obj) == expected.dumps(expected.obj), (column, value)
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("accept", [None, "", "*/*", "application/json", "text/html",
                                    "application/json; indent=4", "application/*",
                                    "text/html, application/json;q=0.9"])
@pytest.mark.parametrize("query", ["", "?format=json", "?format=api"])
def test_the_json_negotiation_shortcut_picks_what_drf_picks(rf, accept, query):
    from rest_framework.exceptions import NotAcceptable
    from rest_framework.negotiation import DefaultContentNegotiation
    from rest_framework.renderers import JSONRenderer
    from rest_framework.request import Request

    from ledger.negotiation import JsonNegotiation

    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    request = Request(rf.get(f"/api/v1/tools{query}", **headers))
    outcomes = []
    for negotiation in (DefaultContentNegotiation(), JsonNegotiation()):
        try:
            renderer, media_type = negotiation.select_renderer(request, [JSONRenderer()])
            outcomes.append((type(renderer), media_type))
        except (NotAcceptable, Exception) as exc:  # noqa: BLE001 - compare what each raises
            outcomes.append(type(exc))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("value", [
    dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 1, 8, 0, 0, 120, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 1, 9, 30, 5, 999999, tzinfo=dt.timezone(dt.timedelta(hours=1))),
    dt.datetime(2026, 12, 1, 8, 0),  # naive: DRF's own path
])
def test_timestamps_render_exactly_as_drf_renders_them(value, settings):
    from rest_framework.fields import DateTimeField

    from ledger.serializers import iso_datetime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the naive value's warning
        assert iso_datetime(value) == DateTimeField().to_representation(value)


def test_insert_parameters_agree_with_each_fields_own_preparation(agent):
    from django.db import connection

    from ledger import rows

    fields = rows.insert_fields(OperationEvent)
    values = {f.attname: f.get_default() for f in fields} | {
        "operation_id": 1, "from_status": "", "to_status": "prepared", "actor": "t",
        "fencing_token": 0, "reason": "r", "data": {"a": 1},
        "created_at": dt.datetime(2026, 12, 1, tzinfo=dt.UTC)}
    expected = [repr(f.get_db_prep_save(values[f.attname], connection)) for f in fields]
    for _ in range(2):  # computed, then remembered for this tuple of fields
        assert [repr(p) for p in rows.insert_params_for(fields, values)] == expected
