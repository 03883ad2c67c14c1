"""Webhooks against a real local HTTP receiver: the outbox, Standard Webhooks signatures,
retries with backoff, a worker killed mid-delivery, re-delivery, and the management command."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from config.celery import app as celery_app
from ledger import executor, outbox, transitions, webhooks
from ledger.models import (
    Operation,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from reconciliation import transitions as case_transitions
from reconciliation.models import Case
from sandbox.testing import PROJECT_ROOT, stop_process
from tests.conftest import refund_params
from tests.ledger.client_helpers import OP, claim, report
from tests.ledger.webhook_receiver import Receiver
from tests.reconciliation.helpers import sweep, unknown_refund
from tests.reconciliation.test_celery_worker import test_database_url

S = Operation.Status
D = WebhookDelivery.Status


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as server:
        yield server


@pytest.fixture
def endpoint(agent, receiver) -> tuple[WebhookEndpoint, str]:
    return webhooks.endpoint_create(agent=agent, url=receiver.url)


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """Tasks enqueued after commit run at once, in this process (no worker needed)."""
    saved = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = saved


def succeeded_by_client(api) -> Operation:
    resource = claim(api)
    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="succeeded", result={"id": "eff_1"}, provider_reference="eff_1")
    assert response.status_code == 200
    return Operation.objects.get(operation_id=OP)


def pending_delivery() -> WebhookDelivery:
    return WebhookDelivery.objects.select_related("event").get(status=D.PENDING)


def verify(secret: str, received) -> dict:
    headers = {k: v for k, v in received.headers.items() if k.startswith("webhook-")}
    return Webhook(secret).verify(received.body, headers)


# --- the outbox -------------------------------------------------------------------------------

def test_an_outcome_writes_its_event_and_a_delivery_per_active_endpoint(api, agent, endpoint):
    removed, _ = webhooks.endpoint_create(agent=agent, url="http://127.0.0.1:9/other")
    webhooks.endpoint_remove(endpoint=removed)

    operation = succeeded_by_client(api)

    event = WebhookEvent.objects.get()
    assert event.type == "operation.succeeded" and event.operation == operation
    assert event.event_id.startswith("evt_")
    assert event.operation_event.to_status == S.SUCCEEDED
    payload = outbox.event_payload(event)
    assert payload["type"] == "operation.succeeded"
    assert payload["data"]["operation_id"] == OP
    assert payload["data"]["status"] == "succeeded"
    assert [d.endpoint for d in WebhookDelivery.objects.all()] == [endpoint[0]]


def test_an_agent_without_endpoints_still_gets_its_events_recorded(api):
    succeeded_by_client(api)

    assert WebhookEvent.objects.count() == 1
    assert not WebhookDelivery.objects.exists()


def test_events_go_only_to_the_operations_own_agent(api, make_agent, receiver):
    other, _ = make_agent("agent-2")
    webhooks.endpoint_create(agent=other, url=receiver.url)

    succeeded_by_client(api)

    assert WebhookEvent.objects.count() == 1 and not WebhookDelivery.objects.exists()


def test_the_event_commits_with_the_change_or_not_at_all(api, endpoint):
    resource = claim(api)
    operation = Operation.objects.get()

    with pytest.raises(RuntimeError), transaction.atomic():
        transitions.operation_succeed(
            operation=operation, fencing_token=resource["claim"]["fencing_token"],
            result={}, provider_request_id="eff_1", actor="test", reason="provider_confirmed")
        assert WebhookEvent.objects.count() == 1  # written inside the transaction…
        raise RuntimeError("the commit never happens")

    assert Operation.objects.get().status == S.IN_FLIGHT  # …and rolled back with it
    assert not WebhookEvent.objects.exists() and not WebhookDelivery.objects.exists()


def test_the_event_catalogue_follows_an_operation_through_review(
    agent, endpoint, sandbox, reviewer
):
    operation = unknown_refund(agent, "lose-response", amount=150_000)  # high value
    sweep()  # looked up, then to a person
    case = Case.objects.get()
    assert case.state == Case.State.AWAITING_REVIEW

    case_transitions.case_resolve(case=case, outcome=S.SUCCEEDED, actor="staff:reviewer-ann",
                                  reason="staff_confirmed", params_hash=operation.params_hash)

    events = list(WebhookEvent.objects.order_by("id"))
    assert [e.type for e in events] == ["operation.unknown", "operation.awaiting_review",
                                        "operation.resolved"]
    unknown, review, resolved = (outbox.event_payload(e)["data"] for e in events)
    assert unknown["status"] == "unknown" and unknown["reconciliation"]["state"] == "checking"
    assert review["reconciliation"]["state"] == "awaiting_review"
    assert resolved["status"] == "succeeded"
    assert resolved["reconciliation"]["resolution"] == "staff_confirmed"
    assert len({e.event_id for e in events}) == 3
    assert WebhookDelivery.objects.count() == 3


def test_a_definitive_rejection_is_operation_failed(api, agent, endpoint, sandbox):
    executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                    params=refund_params(memo="sandbox:reject"))

    assert list(WebhookEvent.objects.values_list("type", flat=True)) == ["operation.failed"]


def test_an_outcome_proven_by_reconciliation_is_operation_resolved(agent, endpoint, sandbox):
    unknown_refund(agent, "lose-response")
    sweep()  # same-key re-send: the provider replays the original

    assert list(WebhookEvent.objects.order_by("id").values_list("type", flat=True)) == [
        "operation.unknown", "operation.resolved"]


# --- signing and delivery ---------------------------------------------------------------------

def test_delivery_is_signed_so_a_standard_webhooks_verifier_accepts_it(
    api, endpoint, receiver
):
    _, secret = endpoint
    succeeded_by_client(api)
    delivery = pending_delivery()

    assert webhooks.deliver(delivery.pk) == D.DELIVERED

    [received] = receiver.received
    payload = verify(secret, received)
    assert payload == outbox.event_payload(delivery.event)
    assert received.headers["webhook-id"] == delivery.event.event_id
    assert received.headers["webhook-signature"].startswith("v1,")
    assert secret.startswith("whsec_")
    delivery.refresh_from_db()
    assert delivery.status == D.DELIVERED and delivery.delivered_at is not None
    [attempt] = WebhookAttempt.objects.all()
    assert attempt.status_code == 200 and attempt.error == ""


def test_a_tampered_body_or_another_secret_does_not_verify(api, endpoint, receiver):
    _, secret = endpoint
    succeeded_by_client(api)
    webhooks.deliver(pending_delivery().pk)
    [received] = receiver.received
    headers = {k: v for k, v in received.headers.items() if k.startswith("webhook-")}

    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(received.body.replace(b"succeeded", b"failed"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(webhooks.new_secret()).verify(received.body, headers)


def test_a_receiver_answering_500_three_times_then_200_gets_it_once_accepted(
    api, endpoint, receiver, frozen
):
    receiver.statuses = [500, 500, 500, 200]
    succeeded_by_client(api)
    delivery = pending_delivery()
    outcomes = []

    for _ in range(4):
        outcomes.append(webhooks.deliver(delivery.pk))
        delivery.refresh_from_db()
        if delivery.status != D.PENDING:
            break
        assert webhooks.deliver(delivery.pk) == "skipped"  # not due before its backoff
        frozen.move_to(delivery.next_attempt_at)

    assert outcomes == ["retry", "retry", "retry", D.DELIVERED]
    assert [r.answered for r in receiver.received] == [500, 500, 500, 200]
    assert len(receiver.accepted) == 1
    assert {r.headers["webhook-id"] for r in receiver.received} == {delivery.event.event_id}
    assert list(WebhookAttempt.objects.order_by("id").values_list("status_code", "error")) == [
        (500, "http_500"), (500, "http_500"), (500, "http_500"), (200, "")]
    assert delivery.attempts == 4 and delivery.next_attempt_at is None
    frozen.shift(dt.timedelta(days=2))
    assert webhooks.sweep_due() == 0 and webhooks.deliver(delivery.pk) == "skipped"
    assert len(receiver.received) == 4


def test_backoff_grows_with_jitter_and_retries_for_at_least_a_day_before_giving_up(
    api, endpoint, receiver, frozen, settings
):
    receiver.statuses = [503] * 10_000
    succeeded_by_client(api)
    delivery = pending_delivery()
    created = delivery.event.created_at
    gaps = []

    while True:
        outcome = webhooks.deliver(delivery.pk)
        delivery.refresh_from_db()
        if outcome != "retry":
            break
        gaps.append((delivery.next_attempt_at - timezone.now()).total_seconds())
        frozen.move_to(delivery.next_attempt_at)

    assert outcome == D.GAVE_UP and delivery.status == D.GAVE_UP
    assert timezone.now() - created >= dt.timedelta(days=1)
    assert timezone.now() - created >= dt.timedelta(
        seconds=settings.LEDGER_WEBHOOK_RETRY_WINDOW_SECONDS)
    base = settings.LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS
    assert base / 2 <= gaps[0] <= base and 2 * base <= gaps[2] <= 4 * base
    assert max(gaps) <= settings.LEDGER_WEBHOOK_BACKOFF_MAX_SECONDS
    assert len(set(gaps)) == len(gaps)  # jitter: no two waits alike
    assert WebhookAttempt.objects.count() == len(receiver.received) == len(gaps) + 1


def test_an_unreachable_receiver_is_a_transport_error_retried_later(api, agent, refused_provider):
    endpoint, _ = webhooks.endpoint_create(agent=agent, url=refused_provider + "/hooks")
    succeeded_by_client(api)

    assert webhooks.deliver(pending_delivery().pk) == "retry"

    [attempt] = WebhookAttempt.objects.all()
    assert attempt.status_code is None and attempt.error == "transport.ConnectError"
    assert refused_provider not in attempt.error


@pytest.mark.django_db(transaction=True)
def test_no_transaction_or_lock_is_held_while_posting(api, endpoint, receiver):
    succeeded_by_client(api)
    delivery = pending_delivery()
    written = []

    def write_the_same_row_meanwhile() -> None:
        from django.db import connection

        try:
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SET lock_timeout = '2s'")
            WebhookDelivery.objects.filter(pk=delivery.pk).update(
                last_attempt_at=F("last_attempt_at"))
            written.append(True)
        finally:
            connection.close()

    receiver.during_request = write_the_same_row_meanwhile

    assert webhooks.deliver(delivery.pk) == D.DELIVERED
    assert written == [True]


@pytest.mark.django_db(transaction=True)
def test_enqueued_on_commit_and_delivered_by_the_task(api, endpoint, receiver, eager_tasks):
    succeeded_by_client(api)

    assert len(receiver.accepted) == 1
    assert WebhookDelivery.objects.get().status == D.DELIVERED


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_delivery_loses_nothing(api, endpoint, receiver, time_machine,
                                                    eager_tasks, tmp_path):
    _, secret = endpoint
    celery_app.conf.task_always_eager = False  # the event waits for the doomed worker
    succeeded_by_client(api)
    delivery = pending_delivery()
    receiver.hold = __import__("threading").Event()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": test_database_url(), "LEDGER_VAR_DIR": str(tmp_path)}
    worker = subprocess.Popen(
        [sys.executable, "-c", "import django; django.setup(); "
         f"from ledger.tasks import deliver_webhook; deliver_webhook({delivery.pk})"],
        cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL)
    try:
        assert receiver.arrived.wait(timeout=30), "the worker never posted"
        worker.kill()  # SIGKILL mid-POST: no answer read, nothing recorded
        worker.wait(timeout=10)
    finally:
        stop_process(worker, timeout=5)
    receiver.hold.set()
    receiver.hold = None

    delivery.refresh_from_db()
    assert delivery.status == D.PENDING and delivery.attempts == 1
    assert not WebhookAttempt.objects.exists()
    assert webhooks.sweep_due() == 0  # hidden while the dead worker's claim lasts
    celery_app.conf.task_always_eager = True
    time_machine.move_to(delivery.next_attempt_at + dt.timedelta(seconds=1), tick=False)

    assert webhooks.sweep_due() == 1  # … then due again, and delivered by the sweep

    delivery.refresh_from_db()
    assert delivery.status == D.DELIVERED and delivery.attempts == 2
    assert len(receiver.accepted) >= 1
    assert {r.headers["webhook-id"] for r in receiver.received} == {delivery.event.event_id}
    assert verify(secret, receiver.accepted[-1])["data"]["status"] == "succeeded"


# --- re-delivery, rotation, the command -------------------------------------------------------

def test_staff_redeliver_from_the_admin_sends_the_same_event_again(
    api, endpoint, receiver, client, django_user_model
):
    succeeded_by_client(api)
    delivery = pending_delivery()
    webhooks.deliver(delivery.pk)
    staff = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw-12345678")
    client.force_login(staff)

    page = client.get(f"/admin/ledger/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200 and b"200" in page.content
    assert endpoint[1].encode() not in page.content  # the secret is never shown
    response = client.post("/admin/ledger/webhookdelivery/", {
        "action": "redeliver", "_selected_action": [delivery.pk]})
    assert response.status_code == 302

    delivery.refresh_from_db()
    assert delivery.status == D.PENDING
    assert WebhookAttempt.objects.filter(error="redelivery_requested", actor="staff:ops").exists()
    assert webhooks.deliver(delivery.pk) == D.DELIVERED
    assert [r.headers["webhook-id"] for r in receiver.received] == [delivery.event.event_id] * 2


def test_the_endpoint_admin_never_shows_the_secret(agent, endpoint, client, django_user_model):
    staff = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw-12345678")
    client.force_login(staff)

    page = client.get(f"/admin/ledger/webhookendpoint/{endpoint[0].pk}/change/")

    assert page.status_code == 200
    assert endpoint[1].encode() not in page.content
    assert endpoint[1].removeprefix("whsec_").encode() not in page.content


def test_after_rotation_both_secrets_sign_during_the_grace_period(api, endpoint, receiver):
    old_secret = endpoint[1]
    new_secret = webhooks.endpoint_rotate(endpoint=endpoint[0])
    succeeded_by_client(api)

    webhooks.deliver(pending_delivery().pk)

    [received] = receiver.received
    assert len(received.headers["webhook-signature"].split(" ")) == 2
    assert verify(old_secret, received) == verify(new_secret, received)


def test_manage_py_webhooks_adds_lists_rotates_and_removes(agent, receiver):
    out = StringIO()
    call_command("webhooks", "add", agent.name, receiver.url, stdout=out)
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret in out.getvalue()  # shown once, at creation

    listing = StringIO()
    call_command("webhooks", "list", stdout=listing)
    assert receiver.url in listing.getvalue() and endpoint.secret not in listing.getvalue()

    rotated = StringIO()
    call_command("webhooks", "rotate", str(endpoint.pk), stdout=rotated)
    endpoint.refresh_from_db()
    assert endpoint.secret in rotated.getvalue() and endpoint.previous_secret

    call_command("webhooks", "remove", str(endpoint.pk), stdout=StringIO())
    endpoint.refresh_from_db()
    assert endpoint.is_active is False


def test_manage_py_webhooks_refuses_bad_input_and_writes_nothing(agent):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("webhooks", "add", "nobody", "https://example.com/h", stdout=StringIO())
    with pytest.raises(CommandError):
        call_command("webhooks", "add", agent.name, "ftp://example.com/h", stdout=StringIO())
    with pytest.raises(CommandError):
        call_command("webhooks", "add", agent.name, "https://u:p@example.com/h",
                     stdout=StringIO())
    assert not WebhookEndpoint.objects.exists()


def test_a_removed_endpoint_gets_nothing_more(api, endpoint, receiver):
    succeeded_by_client(api)
    webhooks.endpoint_remove(endpoint=endpoint[0])

    assert webhooks.deliver(pending_delivery().pk) == D.GAVE_UP
    assert receiver.received == []


@pytest.mark.django_db(transaction=True)
def test_a_lost_enqueue_message_is_picked_up_by_the_sweep(api, endpoint, receiver, eager_tasks,
                                                          monkeypatch):
    from ledger import tasks

    def broker_down(*args):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(tasks.deliver_webhook, "delay", broker_down)
    succeeded_by_client(api)  # the outcome commits; its message never reaches a broker
    assert receiver.received == []
    assert WebhookDelivery.objects.get().status == D.PENDING
    monkeypatch.undo()

    assert webhooks.sweep_due() == 1

    assert len(receiver.accepted) == 1
    assert WebhookDelivery.objects.get().status == D.DELIVERED


def test_staff_redeliver_an_event_from_the_events_admin(api, endpoint, receiver, client,
                                                         django_user_model):
    succeeded_by_client(api)
    delivery = pending_delivery()
    webhooks.deliver(delivery.pk)
    event = delivery.event
    staff = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw-12345678")
    client.force_login(staff)

    page = client.get(f"/admin/ledger/webhookevent/{event.pk}/change/")
    assert page.status_code == 200 and event.event_id.encode() in page.content
    response = client.post("/admin/ledger/webhookevent/", {
        "action": "redeliver", "_selected_action": [event.pk]})

    assert response.status_code == 302
    assert WebhookDelivery.objects.get().status == D.PENDING
    assert webhooks.deliver(delivery.pk) == D.DELIVERED
    assert len(receiver.accepted) == 2
