"""Demo data that shows every state, made through the real executor and the sandbox provider.

Idempotent: the operation IDs are fixed, so running it again replays instead of re-sending —
which is itself the point of the project.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand
from django.db import transaction
from django.urls import reverse

from ledger import executor, transitions
from ledger.auth import agent_create, agent_rotate
from ledger.models import AgentCredential, Operation
from ledger.tools import tool_names

DEMO_AGENT = "demo-agent"


def refund(invoice: str, amount: int, memo: str = "Goodwill refund") -> dict[str, Any]:
    return {"invoice": invoice, "amount": amount, "currency": "EUR", "payee": "cus_demo_42",
            "memo": memo}


# (operation ID, tool, params, what it shows)
SCENARIOS: list[tuple[str, str, dict[str, Any], str]] = [
    ("demo-run-1:invoice-1001:refund-1:v1", "refund", refund("invoice-1001", 2500),
     "succeeded at once"),
    ("demo-run-1:invoice-1002:refund-1:v1", "refund",
     refund("invoice-1002", 4200, "sandbox:reject"), "failed: the provider rejected it"),
    ("demo-run-1:invoice-1003:refund-1:v1", "refund",
     refund("invoice-1003", 3100, "sandbox:lose-response"),
     "unknown: response lost → reconciled by a same-key re-send"),
    ("demo-run-1:invoice-1004:refund-1:v1", "refund",
     refund("invoice-1004", 250_000, "sandbox:500-after-commit"),
     "unknown, high value → review queue"),
    ("demo-run-1:invoice-1005:refund-1:v1", "refund",
     refund("invoice-1005", 1_500_000, "sandbox:lose-response"),
     "unknown, above the four-eyes threshold → two reviewers"),
    ("demo-run-2:customer-7:ticket-1:v1", "create_ticket",
     {"queue": "billing", "customer": "customer-7", "title": "Refund follow-up",
      "description": "sandbox:lose-response"},
     "unknown on a provider without keys → found by lookup"),
    ("demo-run-2:customer-7:email-1:v1", "send_email",
     {"to": "customer7@example.com", "template": "refund_sent", "subject": "Your refund",
      "body": "Hello, your refund is on its way."}, "succeeded"),
]


class Command(BaseCommand):
    help = "Seed demo data showing every state (needs the sandbox provider running)."

    def handle(self, *args: Any, **options: Any) -> None:
        agent = self._agent()
        self._staff()
        for operation_id, tool, params, shows in SCENARIOS:
            submission = executor.submit(agent=agent, operation_id=operation_id, tool_name=tool,
                                         params=params, run_id=operation_id.split(":")[0])
            self._report(submission.operation, shows)
        self._queued(agent)
        self._crashed_worker(agent)

    def _agent(self) -> AgentCredential:
        token_file = Path(settings.VAR_DIR) / "demo-agent-token"
        agent = AgentCredential.objects.filter(name=DEMO_AGENT).first()
        if agent is None:
            agent, raw = agent_create(name=DEMO_AGENT, tools=tool_names())
        elif not token_file.exists():
            raw = agent_rotate(agent=agent)  # the raw token was shown once and is gone
        else:
            raw = ""
        if raw:
            token_file.write_text(raw + "\n")
            token_file.chmod(0o600)
        self.stdout.write(f"Demo agent token: export TOKEN=$(cat {token_file})")
        return agent

    def _staff(self) -> None:
        user_model = get_user_model()
        password = os.environ.get("DEMO_STAFF_PASSWORD", "demo-password")  # explicit dev default
        review = Permission.objects.get(codename="review_case")
        for username, superuser in (("admin", True), ("reviewer2", False)):
            user = user_model.objects.filter(username=username).first()
            if user is None:
                user = user_model.objects.create_user(username=username, password=password,
                                                      is_staff=True, is_superuser=superuser)
                user.user_permissions.add(review)
        self.stdout.write(f"Staff users: admin and reviewer2 (password: {password!r})")

    def _queued(self, agent: AgentCredential) -> None:
        """prepared: recorded for asynchronous execution; the worker sends it."""
        submission = executor.submit(
            agent=agent, operation_id="demo-run-3:customer-9:email-1:v1",
            tool_name="send_email", run_id="demo-run-3", execute=False,
            params={"to": "customer9@example.com", "template": "welcome", "subject": "Hi"})
        self._report(submission.operation, "prepared: queued for a worker")

    def _crashed_worker(self, agent: AgentCredential) -> None:
        """in_flight: claimed by a 'worker' that then died; the lease sweeper takes over."""
        operation_id = "demo-run-3:invoice-1006:refund-1:v1"
        operation = Operation.objects.filter(operation_id=operation_id).first()
        if operation is None:
            # One transaction: the worker's task (enqueued on commit) finds it already claimed.
            with transaction.atomic():
                submission = executor.submit(
                    agent=agent, operation_id=operation_id, tool_name="refund",
                    run_id="demo-run-3", params=refund("invoice-1006", 1800), execute=False)
                transitions.operation_claim(submission.operation, worker="demo-crashed-worker",
                                            lease_seconds=90)
            operation = Operation.objects.get(operation_id=operation_id)
        self._report(operation, "in_flight: its worker 'died'; lease expires in 90 s")

    def _report(self, operation: Operation, shows: str) -> None:
        path = reverse("portal:status", args=[operation.status_token])
        self.stdout.write(f"  {operation.operation_id:42} {operation.status:10} {shows}")
        self.stdout.write(f"      status page: {path}")
