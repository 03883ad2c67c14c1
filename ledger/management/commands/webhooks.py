from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import webhooks
from ledger.models import AgentCredential, WebhookEndpoint


class Command(BaseCommand):
    help = ("Manage an agent's webhook endpoints: add AGENT URL | list [AGENT] | remove ID | "
            "rotate ID. add and rotate print the signing secret once.")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="Send AGENT's events to URL (prints the secret once)")
        add.add_argument("agent")
        add.add_argument("url")
        listing = sub.add_parser("list", help="Endpoints (of one agent, or all)")
        listing.add_argument("agent", nargs="?")
        remove = sub.add_parser("remove", help="Stop delivering to endpoint ID")
        remove.add_argument("endpoint_id", type=int)
        rotate = sub.add_parser("rotate", help="New secret for endpoint ID (prints it once; "
                                               "the old one keeps signing for 24 h)")
        rotate.add_argument("endpoint_id", type=int)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, f"_{action}")(**options)

    def _add(self, *, agent: str, url: str, **options: Any) -> None:
        credential = AgentCredential.objects.filter(name=agent).first()
        if credential is None:
            raise CommandError(f"No agent named {agent!r}.")
        if WebhookEndpoint.objects.filter(agent=credential, url=url).exists():
            raise CommandError("That agent already has this URL; rotate its secret instead.")
        try:
            endpoint, secret = webhooks.endpoint_create(agent=credential, url=url)
        except webhooks.InvalidEndpoint as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Endpoint {endpoint.pk}: {credential.name} → {endpoint.url}")
        self._secret(secret)

    def _list(self, *, agent: str | None = None, **options: Any) -> None:
        endpoints = WebhookEndpoint.objects.select_related("agent").order_by("agent__name", "id")
        if agent:
            endpoints = endpoints.filter(agent__name=agent)
        for endpoint in endpoints:
            state = "active" if endpoint.is_active else "removed"
            self.stdout.write(f"{endpoint.pk}\t{endpoint.agent.name}\t{endpoint.url}\t{state}")

    def _remove(self, *, endpoint_id: int, **options: Any) -> None:
        webhooks.endpoint_remove(endpoint=self._endpoint(endpoint_id))
        self.stdout.write(f"Endpoint {endpoint_id} removed; nothing more is delivered to it.")

    def _rotate(self, *, endpoint_id: int, **options: Any) -> None:
        endpoint = self._endpoint(endpoint_id)
        secret = webhooks.endpoint_rotate(endpoint=endpoint)
        self.stdout.write(f"Endpoint {endpoint.pk}: new secret; the previous one also signs "
                          f"until {endpoint.previous_secret_expires_at:%Y-%m-%d %H:%M} UTC.")
        self._secret(secret)

    def _endpoint(self, endpoint_id: int) -> WebhookEndpoint:
        endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id, is_active=True).first()
        if endpoint is None:
            raise CommandError(f"No active endpoint {endpoint_id}.")
        return endpoint

    def _secret(self, secret: str) -> None:
        self.stdout.write("Signing secret (shown once, store it now):")
        self.stdout.write(secret)
