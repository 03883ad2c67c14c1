"""Personal-data retention: free-text and secret params of terminal operations are blanked
after LEDGER_PARAMS_RETENTION_DAYS; the intent, the hash and the events stay."""

from __future__ import annotations

import datetime as dt

from django.conf import settings as django_settings

from ledger import retention
from ledger.models import Operation, OperationEvent
from ledger.tasks import redact_expired_params
from tests.conftest import submit_body


def submit(api, operation_id, **params):
    body = submit_body(operation_id)
    body["params"].update(params)
    return api.post("/api/v1/operations", body, format="json")


def test_terminal_operations_past_retention_lose_free_text_and_keep_the_intent(
    api, sandbox, settings, frozen
):
    settings.LEDGER_PARAMS_RETENTION_DAYS = 30
    submit(api, "wf-1:inv-1:refund-1:v1", memo="Zoë's parcel arrived broken, call +44 20 7946")
    operation = Operation.objects.get()
    intent, digest = dict(operation.intent_params), operation.params_hash
    events_before = list(operation.events.values_list("reason", flat=True))

    frozen.shift(dt.timedelta(days=29))
    assert retention.redact_expired_params() == 0
    frozen.shift(dt.timedelta(days=1, seconds=1))
    assert redact_expired_params.apply().get() == 1

    operation.refresh_from_db()
    assert operation.params["memo"] == "[redacted]"
    assert {k: operation.params[k] for k in intent} == intent  # intent fields untouched
    assert operation.intent_params == intent and operation.params_hash == digest
    assert operation.params_redacted_at is not None
    assert list(operation.events.values_list("reason", flat=True)) == [
        *events_before, "params_redacted"]
    assert operation.events.last().data == {"fields": ["memo"]}
    assert "Zoë" not in str(Operation.objects.values().get())
    # Running again changes nothing and writes no event.
    assert retention.redact_expired_params() == 0
    assert OperationEvent.objects.filter(reason="params_redacted").count() == 1


def test_unresolved_and_recent_operations_are_kept(api, sandbox, settings, frozen):
    settings.LEDGER_PARAMS_RETENTION_DAYS = 30
    submit(api, "wf-1:inv-1:refund-1:v1", memo="sandbox:lose-response")  # unknown
    frozen.shift(dt.timedelta(days=31))
    submit(api, "wf-1:inv-2:refund-1:v1", invoice="inv-2", memo="recent")  # succeeded now
    assert sorted(Operation.objects.values_list("status", flat=True)) == ["succeeded", "unknown"]

    assert retention.redact_expired_params() == 0
    assert set(Operation.objects.values_list("params__memo", flat=True)) == {
        "sandbox:lose-response", "recent"}


def test_email_bodies_are_redacted_but_recipient_template_and_subject_kept(
    api, sandbox, settings, frozen
):
    settings.LEDGER_PARAMS_RETENTION_DAYS = 1
    body = {"operation_id": "wf-1:cus-1:email-1:v1", "tool": "send_email",
            "params": {"to": "zoe@example.com", "template": "welcome", "subject": "Hi",
                       "body": "Dear Zoë, your address is 1 Main St."}}
    assert api.post("/api/v1/operations", body, format="json").status_code == 201
    frozen.shift(dt.timedelta(days=2))

    assert retention.redact_expired_params() == 1
    params = Operation.objects.get().params
    assert params == {"to": "zoe@example.com", "template": "welcome", "subject": "Hi",
                      "body": "[redacted]"}


def test_the_job_is_on_the_beat_schedule():
    tasks = {entry["task"] for entry in django_settings.CELERY_BEAT_SCHEDULE.values()}
    assert "ledger.tasks.redact_expired_params" in tasks
