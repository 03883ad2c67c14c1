from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.auth import agent_create
from ledger.models import PERSONAL_NAMESPACE_PREFIX, AgentCredential
from ledger.tools import tool_names


class Command(BaseCommand):
    help = "Create an agent credential and print its bearer token once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--tools", required=True,
                            help="Comma-separated tools the agent may use (from the catalogue)")
        parser.add_argument(
            "--namespace", default=None,
            help="Share operation IDs with the other credentials of this namespace (a fleet of "
                 "workers of one service); created if new. Default: a namespace of its own.")

    def handle(self, *args: Any, name: str, tools: str, namespace: str | None = None,
               **options: Any) -> None:
        wanted = [t.strip() for t in tools.split(",") if t.strip()]
        unknown = sorted(set(wanted) - set(tool_names()))
        if unknown:
            raise CommandError(f"Unknown tool(s): {', '.join(unknown)}")
        if AgentCredential.objects.filter(name=name).exists():
            raise CommandError(f"An agent named {name!r} already exists.")
        if namespace is not None and (
            not namespace.strip() or namespace.startswith(PERSONAL_NAMESPACE_PREFIX)
        ):
            raise CommandError(
                f"--namespace must be a name not starting with {PERSONAL_NAMESPACE_PREFIX!r}.")
        agent, raw = agent_create(name=name, tools=wanted, namespace=namespace)
        self.stdout.write(f"Agent {agent.name!r} may use: {', '.join(agent.allowed_tools)}")
        self.stdout.write(f"Namespace: {agent.namespace.name}")
        self.stdout.write("Token (shown once, store it now):")
        self.stdout.write(raw)
