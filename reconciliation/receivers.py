"""Opens a case in the same transaction that makes an operation unknown."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.dispatch import receiver
from django.utils import timezone

from ledger.models import Operation
from ledger.transitions import operation_became_unknown
from reconciliation.models import Case

CASE_DEADLINE = dt.timedelta(hours=4)


@receiver(operation_became_unknown)
def open_case(sender: Any, *, operation: Operation, reason: str, error_class: str,
              **kwargs: Any) -> None:
    now = timezone.now()
    reason = reason if reason in Case.OpenReason.values else Case.OpenReason.AMBIGUOUS_RESPONSE
    case, created = Case.objects.get_or_create(
        operation=operation,
        defaults={"open_reason": reason, "next_check_at": now, "deadline_at": now + CASE_DEADLINE},
    )
    if not created and case.state == Case.State.RESOLVED:
        return
