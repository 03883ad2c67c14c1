"""Operation IDs from business keys, the retry timing, and webhook signatures."""

from __future__ import annotations

import base64
import json
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from agent_ledger_client import (
    UnsafeOperationId,
    WebhookVerificationError,
    check_operation_id,
    operation_id,
    sign_webhook,
    verify_webhook,
)
from agent_ledger_client.retry import RetryPolicy, parse_retry_after
from standardwebhooks.webhooks import Webhook


def test_operation_id_is_built_from_business_keys():
    assert operation_id(workflow="workflow-81", subject="invoice-17", action="refund",
                        sequence=2) == "workflow-81:invoice-17:refund-2:v1"
    assert operation_id(workflow="wf", subject="inv", action="refund", version=2, sequence=1) == \
        "wf:inv:refund-1:v2"


@pytest.mark.parametrize("part", [
    "call_aB3dE5fG7hJ9", "toolu_01A09q90qw90lq917835lq9", "fc_68a1b2c3d4e5", "tooluse_Xy12Ab34Cd",
    str(uuid.uuid4()), uuid.uuid4().hex, "01ARZ3NDEKTSV4RRFFQ69G5FAV", "a3f9c2e1b7d44e0f9a8b",
])
def test_operation_id_refuses_tool_call_ids_and_per_attempt_random_values(part):
    with pytest.raises(UnsafeOperationId):
        operation_id(workflow="workflow-81", subject=part, action="refund", sequence=1)
    with pytest.raises(UnsafeOperationId):
        check_operation_id(f"workflow-81:{part}:refund-1:v1")


@pytest.mark.parametrize("workflow, subject", [
    ("tool-catalogue-sync", "invoice-17"), ("run-2024-11", "cus_123"), ("order-9", "call-back"),
])
def test_operation_id_accepts_business_keys_that_merely_resemble_prefixes(workflow, subject):
    built = operation_id(workflow=workflow, subject=subject, action="refund", sequence=1)
    assert built.startswith(workflow)


@pytest.mark.parametrize("bad", [{"workflow": "a:b"}, {"subject": "has space"}, {"action": ""},
                                 {"sequence": 0}, {"version": 0}, {"sequence": True}])
def test_operation_id_refuses_malformed_parts(bad):
    parts = {"workflow": "wf", "subject": "inv", "action": "refund", "sequence": 1} | bad
    with pytest.raises(UnsafeOperationId):
        operation_id(**parts)


def test_retry_after_wins_over_backoff_and_is_capped():
    policy = RetryPolicy(base_delay=0.25, max_delay=8, max_retry_after=10)
    rng = random.Random(1)
    assert 3 <= policy.delay(1, 3.0, rng) <= 3.25
    assert policy.delay(1, 500.0, rng) <= 10.25


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap():
    policy = RetryPolicy(base_delay=1, max_delay=4)
    rng = random.Random(3)
    for attempt, ceiling in ((1, 1), (2, 2), (3, 4), (9, 4)):
        delays = [policy.delay(attempt, None, rng) for _ in range(200)]
        assert max(delays) <= ceiling and min(delays) >= 0
        assert len(set(delays)) > 100  # jittered, not a fixed schedule


def test_retry_after_reads_seconds_and_http_dates():
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True),
                             now=now) == 30.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


SECRET = "whsec_" + base64.b64encode(b"a-shared-webhook-secret-32-bytes").decode()
BODY = json.dumps({"type": "operation.succeeded", "timestamp": "2026-11-30T12:00:00Z",
                   "data": {"operation_id": "wf:inv:refund-1:v1", "status": "succeeded"}})


def _headers(msg_id: str, timestamp: int, signature: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature}


def test_webhook_signed_by_the_reference_implementation_verifies():
    now = int(time.time())
    signature = Webhook(SECRET).sign("msg_1", datetime.fromtimestamp(now, UTC), BODY)
    event = verify_webhook(BODY.encode(), _headers("msg_1", now, signature), secret=SECRET)
    assert event["data"]["operation_id"] == "wf:inv:refund-1:v1"


def test_our_signature_verifies_with_the_reference_implementation():
    now = int(time.time())
    headers = _headers("msg_2", now, sign_webhook(BODY, secret=SECRET, msg_id="msg_2",
                                                  timestamp=now))
    assert Webhook(SECRET).verify(BODY, headers)["type"] == "operation.succeeded"


def test_any_of_several_signatures_may_match_during_secret_rotation():
    now = int(time.time())
    good = sign_webhook(BODY, secret=SECRET, msg_id="m", timestamp=now)
    headers = _headers("m", now, f"v1,bm90LXRoaXMtb25l {good}")
    assert verify_webhook(BODY, headers, secret=SECRET)["type"] == "operation.succeeded"


@pytest.mark.parametrize("tamper", ["body", "id", "timestamp_old", "secret", "missing"])
def test_tampered_or_stale_webhooks_are_refused(tamper):
    now = int(time.time())
    headers = _headers("m", now, sign_webhook(BODY, secret=SECRET, msg_id="m", timestamp=now))
    body, secret = BODY, SECRET
    if tamper == "body":
        body = BODY.replace("succeeded", "failed")
    elif tamper == "id":
        headers["webhook-id"] = "other"
    elif tamper == "timestamp_old":
        old = now - 3600
        headers = _headers("m", old, sign_webhook(BODY, secret=SECRET, msg_id="m", timestamp=old))
    elif tamper == "secret":
        secret = "whsec_" + base64.b64encode(b"another-secret").decode()
    else:
        del headers["webhook-signature"]
    with pytest.raises(WebhookVerificationError):
        verify_webhook(body, headers, secret=secret)


def test_operation_id_needs_an_explicit_sequence():
    with pytest.raises(TypeError):
        operation_id(workflow="wf", subject="invoice-17", action="refund")  # type: ignore[call-arg]
