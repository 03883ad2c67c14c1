"""Provider adapters by name. Base URLs are read from settings at call time so tests and
deployments can point the same adapter at another server."""

from __future__ import annotations

from django.conf import settings

from ledger.providers.base import Capabilities, ProviderAdapter
from ledger.providers.http import IdempotentHttpAdapter
from ledger.providers.smtp import SmtpEmailAdapter
from ledger.providers.stripe import StripeRefundAdapter


def _sandbox_url() -> str:
    return str(settings.SANDBOX_URL)


def _stripe_api_key() -> str:
    return str(settings.STRIPE_API_KEY)


def _smtp_host() -> str:
    return str(settings.SANDBOX_SMTP_HOST)


def _smtp_port() -> int:
    return int(settings.SANDBOX_SMTP_PORT)


def _email_from() -> str:
    return str(settings.LEDGER_EMAIL_FROM)


DAY = 24 * 3600

_ADAPTERS: dict[str, ProviderAdapter] = {
    # A payments-style API: honours keys for 24 h, lookups by id, key and reference.
    "sandbox": IdempotentHttpAdapter(
        name="sandbox",
        base_url=_sandbox_url,
        capabilities=Capabilities(
            honours_idempotency_keys=True,
            key_retention_seconds=DAY,
            lookup_by_request_id=True,
            lookup_by_key=True,
            lookup_by_reference=True,
            lookup_consistency_seconds=30.0,
            authoritative_absence=True,
        ),
    ),
    # A SaaS API that takes no idempotency keys: only a lookup by our reference can tell.
    "sandbox-nokeys": IdempotentHttpAdapter(
        name="sandbox-nokeys",
        base_url=_sandbox_url,
        capabilities=Capabilities(
            honours_idempotency_keys=False,
            key_retention_seconds=None,
            lookup_by_request_id=True,
            lookup_by_key=False,
            lookup_by_reference=True,
            lookup_consistency_seconds=30.0,
            authoritative_absence=True,
        ),
    ),
    # Refunds through the official Stripe SDK against the sandbox's Stripe-compatible API.
    "stripe-sandbox": StripeRefundAdapter(
        name="stripe-sandbox", base_url=_sandbox_url, api_key=_stripe_api_key
    ),
    # E-mail over SMTP to the sandbox's listener; lookups in its message log by Message-ID.
    "smtp-sandbox": SmtpEmailAdapter(
        name="smtp-sandbox", host=_smtp_host, port=_smtp_port, sender=_email_from,
        search_url=_sandbox_url,
    ),
}


def get_adapter(name: str) -> ProviderAdapter:
    return _ADAPTERS[name]


def adapter_names() -> list[str]:
    return sorted(_ADAPTERS)


def register_adapter(adapter: ProviderAdapter) -> None:
    _ADAPTERS[adapter.name] = adapter
