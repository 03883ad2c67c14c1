"""Provider connectors, by the name a catalogue gives them (`connector = "http"`).

Each connector builds one adapter from its catalogue table; the adapter declares its
capabilities (key retention, lookup consistency window, authoritative absence). Nothing here
imports the tool registry: the catalogue (ledger.catalogue) imports this module, never the
reverse.
"""

from __future__ import annotations

from collections.abc import Callable

from ledger.providers.base import ProviderAdapter
from ledger.providers.config import SettingsReader
from ledger.providers.http import ConnectorContext, build_http
from ledger.providers.smtp import build_smtp
from ledger.providers.stripe import build_stripe

Builder = Callable[..., ProviderAdapter]

CONNECTORS: dict[str, Builder] = {
    # Any JSON API; without [send] it only looks up (tools the client executes, issue 8).
    "http": build_http,
    # Refunds through the official Stripe SDK (https://api.stripe.com unless told otherwise).
    "stripe": build_stripe,
    # E-mail to any SMTP server, with an optional delivery-log search for lookups.
    "smtp": build_smtp,
}


def build_connector(connector: str, reader: SettingsReader, context: ConnectorContext, *,
                    name: str) -> ProviderAdapter:
    return CONNECTORS[connector](reader, context, name=name)


__all__ = ["CONNECTORS", "ConnectorContext", "build_connector"]
