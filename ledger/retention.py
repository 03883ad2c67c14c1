"""Retention of personal data: the free-text and secret params of terminal operations are
blanked LEDGER_PARAMS_RETENTION_DAYS after they were resolved (a Celery beat job).

Kept: the intent params (what the audit needs: amount, currency, payee, invoice, …), the
params hash, the result, and every event. Unresolved operations are never touched: their
params may still be needed to reconcile them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.utils import timezone

from ledger import transitions
from ledger.models import Operation
from ledger.tools import UnknownTool, get_tool

ACTOR = "system:retention"


def fields_to_redact(operation: Operation) -> frozenset[str]:
    """The tool's free-text and secret fields, and any param that is not part of the intent
    (free text is what the intent leaves out: a memo, an e-mail body)."""
    declared: set[str] = set()
    try:
        lookup: Any = get_tool
        try:
            tool = lookup(operation.tool, version=operation.tool_version)
        except TypeError:  # a registry without versions
            tool = lookup(operation.tool)
    except UnknownTool:
        tool = None
    if tool is not None:
        declared |= set(getattr(tool, "free_text_fields", ()) or ())
        declared |= set(getattr(tool, "secret_fields", ()) or ())
        intent = set(tool.intent_fields)
    else:
        intent = set(operation.intent_params or {})
    params = set(operation.params or {})
    return frozenset((params - intent) | (params & declared))


def redact_expired_params(*, now: dt.datetime | None = None, batch: int = 500) -> int:
    """Redact every terminal operation resolved before the retention cut-off; the count."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=settings.LEDGER_PARAMS_RETENTION_DAYS)
    done = 0
    while True:
        rows = list(
            Operation.objects.filter(status__in=Operation.TERMINAL, resolved_at__lt=cutoff,
                                     params_redacted_at__isnull=True)
            .order_by("resolved_at")[:batch]
        )
        for operation in rows:
            if transitions.operation_redact_params(
                operation=operation, fields=fields_to_redact(operation), actor=ACTOR, now=now
            ):
                done += 1
        if len(rows) < batch:
            return done
