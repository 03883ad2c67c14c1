"""Webhook endpoints, signing (Standard Webhooks) and delivery.

Delivery is at least once: an event's deliveries are written in the transaction of the change
(ledger.outbox) and enqueued after commit; a worker claims one with a conditional UPDATE that
hides it for LEDGER_WEBHOOK_VISIBILITY_SECONDS, POSTs with no transaction or lock held, and
records the attempt. A non-2xx or a transport error schedules the next attempt with exponential
backoff and jitter until the retry window (at least a day) has passed. The periodic sweep
enqueues every due delivery again — retries, lost messages, and deliveries whose worker was
killed mid-POST — so nothing is lost, and a receiver may see an event twice: it deduplicates on
webhook-id, which is the event's stable ID.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ledger import dispatch, outbox
from ledger.models import (
    AgentCredential,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)

logger = logging.getLogger(__name__)

D = WebhookDelivery.Status
SECRET_PREFIX = "whsec_"
ROTATION_GRACE = dt.timedelta(hours=24)


# --- secrets and signatures (https://www.standardwebhooks.com/) -------------------------------

def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(*, secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` with the secret's key bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(endpoint: WebhookEndpoint, *, msg_id: str, timestamp: int, body: bytes,
                     now: dt.datetime) -> str:
    """Space-separated signatures: the current secret's, plus the previous one's during the
    grace period after a rotation (receivers accept any one that verifies)."""
    signatures = [sign(secret=endpoint.secret, msg_id=msg_id, timestamp=timestamp, body=body)]
    if endpoint.previous_secret and endpoint.previous_secret_expires_at and \
            now < endpoint.previous_secret_expires_at:
        signatures.append(sign(secret=endpoint.previous_secret, msg_id=msg_id,
                               timestamp=timestamp, body=body))
    return " ".join(signatures)


def body_bytes(payload: dict[str, object]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


# --- endpoints -----------------------------------------------------------------------------

class InvalidEndpoint(ValueError):
    pass


def _checked_url(url: str) -> str:
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidEndpoint("the URL must be http:// or https:// with a host")
    if parsed.userinfo:
        raise InvalidEndpoint("the URL must not carry credentials")
    return url


def endpoint_create(*, agent: AgentCredential, url: str) -> tuple[WebhookEndpoint, str]:
    """A new endpoint for the agent's events; the secret is returned once."""
    secret = new_secret()
    endpoint = WebhookEndpoint.objects.create(agent=agent, url=_checked_url(url), secret=secret)
    return endpoint, secret


def endpoint_rotate(*, endpoint: WebhookEndpoint) -> str:
    """A new secret; the old one keeps signing alongside it for ROTATION_GRACE."""
    now = timezone.now()
    secret = new_secret()
    endpoint.previous_secret, endpoint.secret = endpoint.secret, secret
    endpoint.previous_secret_expires_at, endpoint.rotated_at = now + ROTATION_GRACE, now
    endpoint.save(update_fields=["previous_secret", "secret", "previous_secret_expires_at",
                                 "rotated_at"])
    return secret


def endpoint_remove(*, endpoint: WebhookEndpoint) -> None:
    """Stop delivering to it (its history stays: events and attempts are evidence)."""
    endpoint.is_active = False
    endpoint.save(update_fields=["is_active"])


# --- delivery -------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    latency_ms: int
    error: str

    @property
    def accepted(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def backoff_seconds(attempt: int, *, rng: random.Random | None = None) -> float:
    """Exponential with equal jitter: half of base·2^(n-1) fixed, half random, capped."""
    base = float(settings.LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS)
    cap = float(settings.LEDGER_WEBHOOK_BACKOFF_MAX_SECONDS)
    step = min(cap, base * 2 ** max(0, min(attempt - 1, 30)))
    return step / 2 + (rng or random).uniform(0, step / 2)


def delivery_claim(*, delivery_pk: int, now: dt.datetime) -> WebhookDelivery | None:
    """Take a due pending delivery for one attempt: hidden from every other worker and the
    sweep until the visibility timeout (after which a killed worker's delivery is due again)."""
    until = now + dt.timedelta(seconds=settings.LEDGER_WEBHOOK_VISIBILITY_SECONDS)
    touched = WebhookDelivery.objects.filter(
        pk=delivery_pk, status=D.PENDING, next_attempt_at__lte=now,
    ).update(next_attempt_at=until, attempts=F("attempts") + 1, last_attempt_at=now)
    if touched != 1:
        return None
    return WebhookDelivery.objects.select_related("event", "endpoint").get(pk=delivery_pk)


def deliver(delivery_pk: int, *, actor: str = "worker") -> str:
    """One attempt of one delivery, if it is due. Returns what happened."""
    delivery = delivery_claim(delivery_pk=delivery_pk, now=timezone.now())
    if delivery is None:
        return "skipped"
    if not delivery.endpoint.is_active:
        _finish(delivery, AttemptResult(None, 0, "endpoint_removed"), actor=actor, give_up=True)
        return D.GAVE_UP
    result = post(delivery)  # no transaction, no lock: the claim is what excludes others
    return _finish(delivery, result, actor=actor)


def post(delivery: WebhookDelivery) -> AttemptResult:
    event, endpoint = delivery.event, delivery.endpoint
    now = timezone.now()
    timestamp = int(now.timestamp())
    body = body_bytes(outbox.event_payload(event))
    headers = {
        "content-type": "application/json",
        "user-agent": "agent-ledger-webhooks/1",
        "webhook-id": event.event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(endpoint, msg_id=event.event_id,
                                              timestamp=timestamp, body=body, now=now),
    }
    started = time.perf_counter()
    try:
        response = _client().post(endpoint.url, content=body, headers=headers,
                                  timeout=float(settings.LEDGER_WEBHOOK_TIMEOUT_SECONDS),
                                  follow_redirects=False)
    except httpx.HTTPError as exc:
        # The class only: an exception's text may carry the URL or the receiver's words.
        return AttemptResult(None, _ms_since(started), f"transport.{type(exc).__name__}")
    latency = _ms_since(started)
    error = "" if 200 <= response.status_code < 300 else f"http_{response.status_code}"
    return AttemptResult(response.status_code, latency, error)


_clients: dict[int, httpx.Client] = {}
_clients_lock = threading.Lock()


def _client() -> httpx.Client:
    """One pooled client per process: building one (and its TLS context) per POST costs more
    than the POST. Keyed by pid because a forked Celery child must not share its parent's
    sockets."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        with _clients_lock:
            client = _clients.get(pid)
            if client is None:
                client = httpx.Client(
                    limits=httpx.Limits(max_connections=64, max_keepalive_connections=16))
                _clients[pid] = client
    return client


def _ms_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _finish(delivery: WebhookDelivery, result: AttemptResult, *, actor: str,
            give_up: bool = False) -> str:
    now = timezone.now()
    window = dt.timedelta(seconds=settings.LEDGER_WEBHOOK_RETRY_WINDOW_SECONDS)
    with transaction.atomic():
        WebhookAttempt.objects.create(
            delivery=delivery, attempted_at=now, status_code=result.status_code,
            latency_ms=result.latency_ms, error=result.error[:200], actor=actor[:200])
        pending = WebhookDelivery.objects.filter(pk=delivery.pk, status=D.PENDING)
        if result.accepted:
            pending.update(status=D.DELIVERED, delivered_at=now, next_attempt_at=None)
            return D.DELIVERED
        if give_up or now >= delivery.event.created_at + window:
            pending.update(status=D.GAVE_UP, next_attempt_at=None)
            logger.warning("webhook delivery given up", extra={"delivery_id": delivery.pk})
            return D.GAVE_UP
        next_at = now + dt.timedelta(seconds=backoff_seconds(delivery.attempts))
        pending.update(next_attempt_at=next_at)
    return "retry"


def sweep_due(*, now: dt.datetime | None = None, batch_size: int | None = None) -> int:
    """Enqueue every due pending delivery (retries, lost messages, killed workers)."""
    now = now or timezone.now()
    batch_size = batch_size or settings.LEDGER_WEBHOOK_SWEEP_BATCH_SIZE
    due = list(WebhookDelivery.objects.filter(status=D.PENDING, next_attempt_at__lte=now)
               .order_by("next_attempt_at").values_list("pk", flat=True)[:batch_size])
    for pk in due:
        dispatch.enqueue_on_commit("deliver_webhook", pk)
    return len(due)


def delivery_requeue(*, delivery: WebhookDelivery, actor: str) -> WebhookDelivery:
    """A staff member's re-delivery: due now, whatever it was (delivered, given up or waiting);
    the receiver gets the same webhook-id again."""
    now = timezone.now()
    with transaction.atomic():
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=D.PENDING, next_attempt_at=now, delivered_at=None)
        WebhookAttempt.objects.create(delivery=delivery, attempted_at=now, status_code=None,
                                      latency_ms=0, error="redelivery_requested",
                                      actor=actor[:200])
        dispatch.enqueue_on_commit("deliver_webhook", delivery.pk)
    return WebhookDelivery.objects.get(pk=delivery.pk)
