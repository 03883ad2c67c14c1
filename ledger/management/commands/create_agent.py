from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.auth import agent_create
from ledger.models import AgentCredential
from ledger.tools import tool_names


class Command(BaseCommand):
    help = "Create an agent credential and print its bearer token once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--tools", required=True,
                            help="Comma-separated tools the agent may use (from the catalogue)")

    def handle(self, *args: Any, name: str, tools: str, **options: Any) -> None:
        wanted = [t.strip() for t in tools.split(",") if t.strip()]
        unknown = sorted(set(wanted) - set(tool_names()))
        if unknown:
            raise CommandError(f"Unknown tool(s): {', '.join(unknown)}")
        if AgentCredential.objects.filter(name=name).exists():
            raise CommandError(f"An agent named {name!r} already exists.")
        agent, raw = agent_create(name=name, tools=wanted)
        self.stdout.write(f"Agent {agent.name!r} may use: {', '.join(agent.allowed_tools)}")
        self.stdout.write("Token (shown once, store it now):")
        self.stdout.write(raw)
