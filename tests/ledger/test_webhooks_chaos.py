"""Every state change of a 300-operation chaos run (bench/chaos.py's driver, every fault kind,
concurrent clients and sweepers), followed by client-executed operations whose agents report or
die, produced its webhook event, and every event reached a real receiver with a signature a
Standard Webhooks verifier accepts."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from bench import chaos
from bench.chaos import ChaosConfig, ChaosReport, ShiftedClock, converge, run_chaos
from config.celery import app as celery_app
from ledger import outbox, webhooks
from ledger.models import (
    AgentCredential,
    Operation,
    OperationEvent,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from ledger.tools import get_tool
from reconciliation.models import CaseEvent
from tests.ledger.webhook_receiver import Receiver

S = Operation.Status
OUTCOMES = (S.SUCCEEDED, S.FAILED, S.UNKNOWN)


def expected_type(change: OperationEvent, was_unknown_before: bool) -> str:
    if change.to_status == S.UNKNOWN:
        return "operation.unknown"
    if was_unknown_before:
        return "operation.resolved"
    return f"operation.{change.to_status}"


BEHAVIOURS = ("report_success", "report_unknown", "die_after_sending", "die_before_sending")


def client_executed_phase(sandbox, receiver, clock) -> dict[str, set[str]]:
    """After the server-side chaos: 40 client-executed refunds whose agent reports success,
    reports unknown, or dies before or after calling the provider; then the sweeps again."""
    from rest_framework.test import APIClient

    from ledger.auth import agent_create
    from tests.ledger.client_helpers import call_provider, client_body, report

    agent, token = agent_create(name="chaos-client", tools=["refund"])
    webhooks.endpoint_create(agent=agent, url=receiver.url)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    behaviour_of = {}
    for n in range(40):
        operation_id = f"chaos-client:obj-{n}:refund-1:v1"
        behaviour = BEHAVIOURS[n % len(BEHAVIOURS)]
        behaviour_of[operation_id] = behaviour
        resource = api.post("/api/v1/operations", client_body(operation_id), format="json").json()
        if behaviour != "die_before_sending":
            assert call_provider(sandbox.url, resource).status_code == 201
        token_ = resource["claim"]["fencing_token"]
        if behaviour == "report_success":
            report(api, operation_id, fencing_token=token_, status="succeeded", result={},
                   provider_reference="eff")
        elif behaviour == "report_unknown":
            report(api, operation_id, fencing_token=token_, status="unknown",
                   error_class="transport.ReadTimeout")
    clock.advance(get_tool("refund").lease_seconds + 1)
    converge(clock, sweepers=3, timeout=120, report=ChaosReport())
    statuses: dict[str, set[str]] = {}
    for operation in Operation.objects.filter(operation_id__startswith="chaos-client:"):
        statuses.setdefault(behaviour_of[operation.operation_id], set()).add(operation.status)
    return statuses


@pytest.mark.django_db(transaction=True)
def test_every_state_change_of_a_chaos_run_produced_its_event(sandbox, time_machine,
                                                              monkeypatch):
    time_machine.move_to(timezone.now(), tick=True)
    with Receiver() as receiver:
        make_agents = chaos.make_agents

        def agents_with_webhooks(count: int, tools: tuple[str, ...] = chaos.TOOLS) -> list[str]:
            tokens = make_agents(count, tools)
            for agent in AgentCredential.objects.filter(name__startswith="chaos-agent-"):
                webhooks.endpoint_create(agent=agent, url=receiver.url)
            return tokens

        monkeypatch.setattr(chaos, "make_agents", agents_with_webhooks)
        config = ChaosConfig(operations=300, clients=12, agents=8, sweepers=3,
                             chaos_probability=0.35, high_value_share=0.3, seed=13,
                             converge_timeout=180)

        report = run_chaos(config, sandbox, ShiftedClock(time_machine.shift, sandbox))

        print("\n".join(report.lines()))
        assert report.operations == 300 and report.violations == []
        clock = ShiftedClock(time_machine.shift, sandbox)
        client_statuses = client_executed_phase(sandbox, receiver, clock)
        assert client_statuses == {"report_success": {S.SUCCEEDED},
                                   "report_unknown": {S.SUCCEEDED},
                                   "die_after_sending": {S.SUCCEEDED},
                                   "die_before_sending": {S.FAILED}}
        counts = sandbox.effect_counts()
        assert all(n == 1 for n in counts.values())

        # 1. Each outcome-level transition of the ledger has exactly its event.
        changes = list(OperationEvent.objects.exclude(from_status=F("to_status"))
                       .filter(to_status__in=OUTCOMES).order_by("id"))
        events = {e.operation_event_id: e for e in WebhookEvent.objects.exclude(
            operation_event=None)}
        unknown_seen: set[int] = set()
        for change in changes:
            event = events.get(change.pk)
            assert event is not None, f"no event for {change}"
            assert event.type == expected_type(change, change.operation_id in unknown_seen)
            assert outbox.event_payload(event)["data"]["status"] == change.to_status
            if change.to_status == S.UNKNOWN:
                unknown_seen.add(change.operation_id)
        assert len(events) == len(changes)
        assert Counter(e.type for e in events.values())["operation.resolved"] > 0

        # 2. Each escalation to a person has its operation.awaiting_review.
        escalations = Counter(CaseEvent.objects.filter(
            from_state="checking", to_state="awaiting_review").values_list(
            "case__operation_id", flat=True))
        reviews = Counter(WebhookEvent.objects.filter(type="operation.awaiting_review")
                          .values_list("operation_id", flat=True))
        assert escalations == reviews and sum(reviews.values()) > 0

        # 3. Every event reaches the receiver, signed.
        celery_app.conf.task_always_eager = True
        try:
            for _ in range(50):
                if webhooks.sweep_due() == 0:
                    break
        finally:
            celery_app.conf.task_always_eager = False
        all_events = {e.event_id: e for e in WebhookEvent.objects.all()}
        assert WebhookDelivery.objects.count() == len(all_events)
        assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}
        secrets = {e.agent_id: e.secret for e in WebhookEndpoint.objects.all()}
        received_ids = set()
        for received in receiver.accepted:
            event = all_events[received.headers["webhook-id"]]
            headers = {k: v for k, v in received.headers.items() if k.startswith("webhook-")}
            assert Webhook(secrets[event.agent_id]).verify(received.body, headers) == \
                outbox.event_payload(event)
            received_ids.add(event.event_id)
        assert received_ids == set(all_events)
