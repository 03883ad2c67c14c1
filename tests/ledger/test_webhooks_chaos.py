"""Every state change of a 300-operation chaos run (bench/chaos.py's driver, every fault kind,
concurrent clients and sweepers) produced its webhook event, and every event reached a real
receiver with a signature a Standard Webhooks verifier accepts."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from bench import chaos
from bench.chaos import ChaosConfig, ShiftedClock, run_chaos
from config.celery import app as celery_app
from ledger import webhooks
from ledger.models import (
    AgentCredential,
    Operation,
    OperationEvent,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
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


@pytest.mark.django_db(transaction=True)
def test_every_state_change_of_a_chaos_run_produced_its_event(sandbox, time_machine,
                                                              monkeypatch):
    time_machine.move_to(timezone.now(), tick=True)
    with Receiver() as receiver:
        make_agents = chaos.make_agents

        def agents_with_webhooks(count: int) -> list[str]:
            tokens = make_agents(count)
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
            assert event.payload["data"]["status"] == change.to_status
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
                event.payload
            received_ids.add(event.event_id)
        assert received_ids == set(all_events)
