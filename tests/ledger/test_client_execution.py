"""Client-executed operations: the ledger records and claims, the agent calls the provider
itself with the ledger's key and reports the outcome with its fencing token."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from rest_framework.test import APIClient

from ledger import executor
from ledger.models import Operation, OperationEvent, WebhookEvent
from ledger.providers.base import Capabilities
from ledger.tools import get_tool
from reconciliation import reconciler, services
from reconciliation.models import Case
from tests.conftest import CATALOGUES, refund_params, requires_postgres
from tests.ledger.client_helpers import (
    OP,
    call_provider,
    claim,
    client_body,
    heartbeat,
    report,
)
from tests.reconciliation.helpers import evidence_of, operation_reasons, sweep

S = Operation.Status


def move(frozen, sandbox, seconds: float) -> None:
    frozen.shift(seconds)
    sandbox.advance_clock(seconds)


def reasons() -> list[str]:
    return list(OperationEvent.objects.order_by("id").values_list("reason", flat=True))


# --- the claim --------------------------------------------------------------------------------

def test_client_submission_is_recorded_and_claimed_and_the_ledger_sends_nothing(
    api, agent, sandbox
):
    response = api.post("/api/v1/operations", client_body(), format="json")

    assert response.status_code == 202
    body = response.json()
    operation = Operation.objects.get()
    assert body["status"] == "in_flight" and body["execution"] == "client"
    assert body["claim"] == {
        "fencing_token": 1,
        "lease_expires_at": body["claim"]["lease_expires_at"],
        "idempotency_key": operation.idempotency_key,
    }
    assert operation.status == S.IN_FLIGHT and operation.fencing_token == 1
    assert operation.execution == Operation.Execution.CLIENT
    assert operation.lease_owner == f"client:{agent.name}"
    assert response["Location"].endswith(f"/api/v1/operations/{OP}")
    assert reasons() == ["intent_recorded", "claimed_by_client"]
    assert sandbox.request_counts()["total"] == 0  # the agent sends, not the ledger


def test_a_second_caller_for_the_same_operation_gets_the_pending_answer_without_a_claim(
    api, sandbox
):
    first = claim(api)
    again = api.post("/api/v1/operations", client_body(), format="json")

    assert again.status_code == 202
    assert again.json()["status"] == "in_flight" and again.json()["claim"] is None
    assert Operation.objects.get().fencing_token == first["claim"]["fencing_token"]
    assert reasons() == ["intent_recorded", "claimed_by_client"]


def test_client_execution_keeps_the_params_conflict_rule(api):
    claim(api)
    response = api.post("/api/v1/operations", client_body(amount=9999), format="json")

    assert response.status_code == 422
    assert response.json()["code"] == "params_conflict"
    assert Operation.objects.get().intent_params["amount"] == 2500


def test_a_tool_whose_catalogue_entry_forbids_client_execution_is_refused(
    settings, monkeypatch, tmp_path, sandbox_server, make_agent
):
    # The README's catalogue example, with its payout tool closed to client execution.
    declared = (CATALOGUES / "acme.toml").read_text()
    declared = declared.replace("unknown_sla_seconds = 900\n",
                                "unknown_sla_seconds = 900\nclient_execution = false\n", 1)
    (tmp_path / "tools.toml").write_text(declared)
    monkeypatch.setenv("ACME_PAYOUTS_URL", sandbox_server.url)
    monkeypatch.setenv("ACME_PAYOUTS_TOKEN", "Bearer acme-test")
    settings.LEDGER_TOOLS_FILE = str(tmp_path / "tools.toml")
    agent, token = make_agent("treasury-bot", tools=("payout",))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    response = client.post("/api/v1/operations", {
        "operation_id": "treasury:inv-1:payout-1:v1", "tool": "payout", "execution": "client",
        "params": {"supplier": "sup_42", "invoice": "inv-1", "amount_minor": 100,
                   "currency": "EUR"}}, format="json")

    assert response.status_code == 400
    assert "execution" in response.json()["errors"]
    assert not Operation.objects.exists()


def test_other_resources_carry_a_null_claim(api, sandbox):
    created = api.post("/api/v1/operations", client_body(), format="json").json()

    read = api.get(f"/api/v1/operations/{created['operation_id']}").json()

    assert "claim" in read and read["claim"] is None


# --- the happy path ---------------------------------------------------------------------------

def test_client_happy_path_calls_the_provider_once_and_reports_success(api, sandbox):
    resource = claim(api)
    sent = call_provider(sandbox.url, resource)
    assert sent.status_code == 201

    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="succeeded", result=sent.json(), provider_reference=sent.json()["id"])

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "succeeded" and body["claim"] is None
    assert body["provider_request_id"] == sent.json()["id"]
    operation = Operation.objects.get()
    assert operation.status == S.SUCCEEDED and operation.result == sent.json()
    assert operation.lease_expires_at is None
    assert reasons() == ["intent_recorded", "claimed_by_client", "client_reported_success"]
    assert sandbox.effect_counts() == {OP: 1}
    assert list(WebhookEvent.objects.values_list("type", flat=True)) == ["operation.succeeded"]
    # A replay of the terminal operation answers the stored result, client or not.
    replay = api.post("/api/v1/operations", client_body(), format="json")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"


def test_reporting_the_same_outcome_twice_is_idempotent(api, sandbox):
    resource = claim(api)
    token = resource["claim"]["fencing_token"]
    first = report(api, OP, fencing_token=token, status="succeeded", result={"id": "eff_1"},
                   provider_reference="eff_1")
    events = reasons()

    second = report(api, OP, fencing_token=token, status="succeeded", result={"id": "eff_1"},
                    provider_reference="eff_1")

    assert first.status_code == second.status_code == 200
    assert second.json()["status"] == "succeeded"
    assert reasons() == events  # nothing new written
    assert WebhookEvent.objects.count() == 1


def test_a_definitive_rejection_needs_an_error_class_and_fails_the_operation(api):
    resource = claim(api)
    token = resource["claim"]["fencing_token"]

    refused = report(api, OP, fencing_token=token, status="failed")
    assert refused.status_code == 400 and "error_class" in refused.json()["errors"]
    assert Operation.objects.get().status == S.IN_FLIGHT
    assert reasons() == ["intent_recorded", "claimed_by_client"]

    failed = report(api, OP, fencing_token=token, status="failed",
                    error_class="http_402.card_declined")
    assert failed.status_code == 200 and failed.json()["status"] == "failed"
    assert Operation.objects.get().error_class == "http_402.card_declined"
    assert list(WebhookEvent.objects.values_list("type", flat=True)) == ["operation.failed"]


def test_an_error_class_that_looks_like_free_text_is_refused(api):
    resource = claim(api)

    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="failed", error_class="card 4242 4242 declined for jane@x.org")

    assert response.status_code == 400
    assert Operation.objects.get().status == S.IN_FLIGHT


def test_an_unknown_report_opens_a_case_and_reconciliation_proves_it(api, sandbox):
    resource = claim(api)
    call_provider(sandbox.url, resource)

    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="unknown", error_class="transport.ReadTimeout")

    assert response.status_code == 200 and response.json()["status"] == "unknown"
    case = Case.objects.get()
    assert case.state == Case.State.CHECKING
    sweep()
    operation = Operation.objects.get()
    assert operation.status == S.SUCCEEDED
    assert sandbox.request_counts()["total"] == 1  # looked up, never re-sent
    assert "reconciler_resend" not in operation_reasons(operation)
    assert list(WebhookEvent.objects.order_by("id").values_list("type", flat=True)) == [
        "operation.unknown", "operation.resolved"]


# --- stale and wrong tokens -------------------------------------------------------------------

def test_a_wrong_token_gets_409_and_its_report_is_kept_as_evidence_never_applied(api):
    resource = claim(api)

    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"] + 1,
                      status="succeeded", result={"id": "eff_forged"}, provider_reference="x")

    assert response.status_code == 409
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["code"] == "stale_fencing_token"
    operation = Operation.objects.get()
    assert operation.status == S.IN_FLIGHT and operation.result is None
    stale = OperationEvent.objects.get(reason="stale_result_ignored")
    assert stale.fencing_token == 2
    assert stale.data["client_report"]["provider_reference"] == "x"
    assert not WebhookEvent.objects.exists()


def test_stale_token_after_lease_expiry_is_evidence_on_the_case_only(api, sandbox, frozen):
    resource = claim(api)
    token = resource["claim"]["fencing_token"]
    sent = call_provider(sandbox.url, resource)
    move(frozen, sandbox, get_tool("refund").lease_seconds + 1)
    assert services.sweep_expired_leases() == 1

    response = report(api, OP, fencing_token=token, status="succeeded", result=sent.json(),
                      provider_reference=sent.json()["id"])

    assert response.status_code == 409 and response.json()["code"] == "stale_fencing_token"
    assert response.json()["operation_status"] == "unknown"
    operation = Operation.objects.get()
    assert operation.status == S.UNKNOWN and operation.result is None  # never applied
    case = Case.objects.get()
    [evidence] = evidence_of(case)
    assert (evidence.kind, evidence.outcome) == ("stale_result", "confirmed")
    assert evidence.response["client_report"]["provider_reference"] == sent.json()["id"]
    assert "stale_result_received" in case.events.values_list("reason", flat=True)
    # The reconciler then proves it with the provider, not with the client's word.
    sweep()
    assert Operation.objects.get().status == S.SUCCEEDED
    assert sandbox.effect_counts() == {OP: 1}


def test_a_report_after_the_lease_ran_out_but_before_the_sweep_is_stale_too(
    api, sandbox, frozen
):
    resource = claim(api)
    move(frozen, sandbox, get_tool("refund").lease_seconds + 1)

    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="succeeded", result={}, provider_reference="eff_late")

    assert response.status_code == 409
    operation = Operation.objects.get()
    assert operation.status == S.UNKNOWN and operation.error_class == "lease_expired"
    assert Case.objects.get().open_reason == "lease_expired"


def test_a_different_outcome_after_an_outcome_is_refused_and_kept(api):
    resource = claim(api)
    token = resource["claim"]["fencing_token"]
    report(api, OP, fencing_token=token, status="unknown", error_class="transport.ReadTimeout")

    response = report(api, OP, fencing_token=token, status="succeeded", result={},
                      provider_reference="eff_9")

    assert response.status_code == 409
    assert Operation.objects.get().status == S.UNKNOWN
    assert OperationEvent.objects.filter(reason="stale_result_ignored").count() == 1


def test_another_agents_operation_is_not_found(api, second_agent_api):
    resource = claim(api)

    response = report(second_agent_api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="succeeded", result={}, provider_reference="x")

    assert response.status_code == 404
    assert Operation.objects.get().status == S.IN_FLIGHT


# --- heartbeat ----------------------------------------------------------------------------------

def test_heartbeat_extends_the_lease(api, frozen, sandbox):
    resource = claim(api)
    token = resource["claim"]["fencing_token"]
    move(frozen, sandbox, 40)

    response = heartbeat(api, OP, token)

    assert response.status_code == 200
    body = response.json()
    operation = Operation.objects.get()
    assert body == {"operation_id": OP, "fencing_token": token,
                    "lease_expires_at": body["lease_expires_at"]}
    assert body["lease_expires_at"] > resource["claim"]["lease_expires_at"]
    move(frozen, sandbox, 40)  # past the first lease, inside the extended one
    assert services.sweep_expired_leases() == 0
    assert Operation.objects.get().status == S.IN_FLIGHT
    assert operation.events.filter(reason="lease_extended").count() == 1


def test_heartbeat_with_a_wrong_token_or_after_the_lease_ran_out_is_409(api, frozen, sandbox):
    resource = claim(api)
    token = resource["claim"]["fencing_token"]

    assert heartbeat(api, OP, token + 1).status_code == 409
    move(frozen, sandbox, get_tool("refund").lease_seconds + 1)
    expired = heartbeat(api, OP, token)

    assert expired.status_code == 409 and expired.json()["code"] == "stale_fencing_token"
    assert not OperationEvent.objects.filter(reason="lease_extended").exists()


# --- a client that dies -----------------------------------------------------------------------

def test_client_killed_after_sending_is_proven_by_lookup_with_exactly_one_effect(
    api, sandbox, frozen
):
    resource = claim(api)
    assert call_provider(sandbox.url, resource).status_code == 201
    # … and the client dies before reporting.
    move(frozen, sandbox, get_tool("refund").lease_seconds + 1)
    assert services.sweep_expired_leases() == 1
    operation = Operation.objects.get()
    assert operation.status == S.UNKNOWN
    assert Case.objects.get().open_reason == "lease_expired"

    sweep()

    operation = Operation.objects.get()
    case = Case.objects.get()
    assert operation.status == S.SUCCEEDED and case.state == Case.State.RESOLVED
    assert [e.kind for e in evidence_of(case)] == ["lookup"]
    assert sandbox.effect_counts() == {OP: 1}
    assert sandbox.request_counts()["total"] == 1  # nothing re-sent on the client's behalf
    assert list(WebhookEvent.objects.order_by("id").values_list("type", flat=True)) == [
        "operation.unknown", "operation.resolved"]


def test_client_killed_before_sending_is_proven_absent_and_never_sent(api, sandbox, frozen):
    claim(api)
    move(frozen, sandbox, get_tool("refund").lease_seconds + 1)
    services.sweep_expired_leases()

    for _ in range(12):
        sweep()
        case = Case.objects.get()
        if case.state != Case.State.CHECKING:
            break
        move(frozen, sandbox, max(1.0, (case.next_check_at - frozen_now()).total_seconds()))

    assert Operation.objects.get().status == S.FAILED
    assert sandbox.request_counts()["total"] == 0
    assert sandbox.effect_counts() == {}


def frozen_now():
    from django.utils import timezone

    return timezone.now()


def test_the_reconciler_plans_no_resend_for_a_client_operation_even_inside_retention(
    api, sandbox
):
    claim(api)
    operation = Operation.objects.get()
    case = Case(deadline_at=frozen_now().replace(year=2100))
    keys_and_lookups = Capabilities(
        honours_idempotency_keys=True, key_retention_seconds=86400, lookup_by_request_id=True,
        lookup_by_key=True, lookup_by_reference=True, lookup_consistency_seconds=0,
        authoritative_absence=True)
    keys_only = Capabilities(
        honours_idempotency_keys=True, key_retention_seconds=86400, lookup_by_request_id=False,
        lookup_by_key=False, lookup_by_reference=False, lookup_consistency_seconds=0,
        authoritative_absence=False)
    tool = get_tool("refund")

    with_lookup = reconciler.plan_for(case, operation, tool, keys_and_lookups, frozen_now())
    lookup_only_none = reconciler.plan_for(case, operation, tool, keys_only, frozen_now())

    assert with_lookup.strategy == "lookup"
    assert (lookup_only_none.strategy, lookup_only_none.reason) == ("escalate", "no_strategy")
    assert reconciler.resend_allowed_until(operation, keys_and_lookups) is None


def test_staff_cannot_resend_a_client_operation(api, sandbox, frozen):
    claim(api)
    move(frozen, sandbox, get_tool("refund").lease_seconds + 1)
    services.sweep_expired_leases()
    case = Case.objects.get()

    with pytest.raises(services.ResendNotAllowed):
        services.case_resend_same_key(case=case, actor="staff:ann")

    assert sandbox.request_counts()["total"] == 0
    assert Operation.objects.get().status == S.UNKNOWN


def test_the_unsent_sweeper_and_workers_never_send_a_client_operation(api, sandbox):
    claim(api)
    operation = Operation.objects.get()

    assert executor.execute_prepared(operation).status == S.IN_FLIGHT
    assert executor.retry_unsent() == 0
    assert sandbox.request_counts()["total"] == 0


# --- two clients racing -----------------------------------------------------------------------

@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_two_clients_racing_for_the_claim_exactly_one_gets_it(agent_and_token):
    token = agent_and_token[1]
    barrier = threading.Barrier(2)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def client() -> None:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        try:
            barrier.wait()
            response = api.post("/api/v1/operations", client_body(), format="json")
            with lock:
                answers.append((response.status_code, response.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=client) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert [code for code, _ in answers] == [202, 202]
    claims = [body["claim"] for _, body in answers if body["claim"] is not None]
    assert len(claims) == 1 and claims[0]["fencing_token"] == 1
    operation = Operation.objects.get()
    assert operation.status == S.IN_FLIGHT and operation.fencing_token == 1
    assert operation.attempts == 1
    assert list(operation.events.values_list("reason", flat=True).order_by("id")) == [
        "intent_recorded", "claimed_by_client"]


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_two_racing_reports_with_the_same_token_apply_one_outcome(agent_and_token):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_and_token[1]}")
    resource = claim(api)
    token = resource["claim"]["fencing_token"]
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def reporter(status: str) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_and_token[1]}")
        try:
            barrier.wait()
            body = {"fencing_token": token, "status": status, "result": {"id": "eff_1"},
                    "provider_reference": "eff_1", "error_class": "http_402.declined"}
            codes.append(report(client, OP, **body).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reporter, args=(s,)) for s in ("succeeded", "failed")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(codes) == [200, 409]
    operation = Operation.objects.get()
    assert operation.status in (S.SUCCEEDED, S.FAILED)
    assert operation.events.exclude(from_status=S.IN_FLIGHT, to_status=S.IN_FLIGHT).filter(
        from_status=S.IN_FLIGHT).count() == 1
    assert WebhookEvent.objects.count() == 1


def test_refund_params_sent_by_the_client_match_the_intent(api, sandbox):
    """The lookup verifies every intent field: a client that sent other params is an anomaly."""
    resource = claim(api)
    call_provider(sandbox.url, resource, params=refund_params(amount=9999))
    report(api, OP, fencing_token=resource["claim"]["fencing_token"], status="unknown")

    sweep()

    case = Case.objects.get()
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "anomaly")
    assert Operation.objects.get().status == S.UNKNOWN


def test_absence_is_judged_from_the_end_of_the_clients_claim_not_from_the_claim(
    api, sandbox, frozen
):
    """The agent may call the provider at any moment of its lease: a lookup right after the
    lease ran out proves nothing yet, however long ago the claim was made."""
    claim(api)
    move(frozen, sandbox, get_tool("refund").lease_seconds + 1)
    services.sweep_expired_leases()

    sweep()

    case = Case.objects.get()
    assert case.state == Case.State.CHECKING
    assert Operation.objects.get().status == S.UNKNOWN
    assert [e.outcome for e in evidence_of(case)] == ["not_found"]


def test_heartbeat_and_outcome_for_another_agents_operation_are_not_found(
    api, second_agent_api
):
    resource = claim(api)
    token = resource["claim"]["fencing_token"]

    assert heartbeat(second_agent_api, OP, token).status_code == 404
    assert report(second_agent_api, OP, fencing_token=token, status="unknown").status_code == 404
    assert reasons() == ["intent_recorded", "claimed_by_client"]


@pytest.mark.parametrize("body", [
    {},
    {"fencing_token": 1},
    {"fencing_token": "one", "status": "succeeded"},
    {"fencing_token": 1, "status": "done"},
    {"fencing_token": 1, "status": "succeeded", "result": [1, 2]},
])
def test_a_malformed_outcome_is_a_400_and_writes_nothing(api, body):
    claim(api)

    response = report(api, OP, **body)

    assert response.status_code == 400 and response.json()["code"] == "invalid"
    assert reasons() == ["intent_recorded", "claimed_by_client"]
    assert Operation.objects.get().status == S.IN_FLIGHT
