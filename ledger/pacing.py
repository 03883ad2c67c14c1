"""When an agent should look again, and what it should do meanwhile (Retry-After, guidance).

Both follow the actual situation: a claim in flight until its lease runs out, a case checking
with the provider until its next check, a case waiting for a person until their deadline. The
case is read through the operation's reverse accessor (the ledger never imports
reconciliation), exactly as the serializer's reconciliation summary is.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone

from ledger.models import Operation

S = Operation.Status

BASE_GUIDANCE = {
    S.PREPARED: (
        "Not sent yet: it is safe to submit the same request again with the same operation ID, "
        "or poll this resource; never use a new operation ID for this intent."
    ),
    S.IN_FLIGHT: (
        "In progress: do not retry with a new operation ID; poll this resource until the status "
        "is succeeded or failed."
    ),
    S.UNKNOWN: (
        "Outcome unknown: do not retry with a new operation ID; poll this resource while the "
        "ledger confirms with the provider."
    ),
    S.SUCCEEDED: (
        "Completed: the action happened; use this result and do not submit it again."
    ),
    S.FAILED: (
        "Not completed: nothing happened; to try again submit a new intent under the next "
        "version of the operation ID (for example …:v2)."
    ),
}

# A person works on minutes, not seconds: polling faster only costs requests.
AWAITING_REVIEW_RETRY_AFTER = 300
MAX_CHECKING_RETRY_AFTER = 300


@dataclass(frozen=True)
class Pace:
    retry_after: int | None  # seconds; None for a terminal operation
    guidance: str


def case_of(operation: Operation) -> Any | None:
    try:
        return operation.reconciliation_case
    except ObjectDoesNotExist:
        return None


def _seconds_until(moment: dt.datetime | None, now: dt.datetime, *, cap: int) -> int:
    if moment is None:
        return int(settings.LEDGER_RETRY_AFTER_SECONDS)
    return max(1, min(cap, math.ceil((moment - now).total_seconds())))


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def pace(operation: Operation, now: dt.datetime | None = None) -> Pace:
    now = now or timezone.now()
    status = S(operation.status)
    base = BASE_GUIDANCE[status]
    if status in Operation.TERMINAL:
        return Pace(None, base)
    if status == S.IN_FLIGHT:
        lease = operation.lease_expires_at
        if lease is None:
            return Pace(int(settings.LEDGER_RETRY_AFTER_SECONDS), base)
        return Pace(_seconds_until(lease, now, cap=3600),
                    f"{base} The current attempt holds it until {_iso(lease)} at the latest.")
    if status == S.UNKNOWN:
        return _unknown_pace(case_of(operation), now, base)
    return Pace(int(settings.LEDGER_RETRY_AFTER_SECONDS), base)


def _unknown_pace(case: Any, now: dt.datetime, base: str) -> Pace:
    if case is not None and case.state == "awaiting_review":
        deadline = case.review_deadline_at
        by = f" by {_iso(deadline)}" if deadline else ""
        return Pace(AWAITING_REVIEW_RETRY_AFTER, (
            "Outcome unknown: do not retry with a new operation ID; a person is reviewing the "
            f"evidence and decides{by}; check back in a few minutes (or wait for the webhook)."
        ))
    next_check = case.next_check_at if case is not None else None
    if next_check is None:
        return Pace(int(settings.LEDGER_RETRY_AFTER_SECONDS), base)
    return Pace(_seconds_until(next_check, now, cap=MAX_CHECKING_RETRY_AFTER),
                f"{base} The next check is due at {_iso(next_check)}.")
