"""Small formatting helpers for the review pages."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django import template
from django.utils import timezone

from ledger.money import format_money
from reconciliation.models import Case
from reconciliation.review import presentation, services

register = template.Library()

SOON = dt.timedelta(hours=1)


@register.filter
def money(amount: int | None, currency: str = "") -> str:
    if amount is None:
        return "—"
    return format_money(amount, currency)


@register.filter
def duration(delta: dt.timedelta | None) -> str:
    """"2 d 3 h", "3 h 5 min", "12 min", "under a minute"."""
    if delta is None:
        return "—"
    minutes = int(abs(delta).total_seconds() // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else "under a minute"


@register.simple_tag
def deadline(case: Any, now: dt.datetime | None = None) -> dict[str, str]:
    now = now or timezone.now()
    at = case.review_deadline_at
    if at is None:
        return {"state": "none", "text": "No deadline"}
    left = at - now
    if left.total_seconds() <= 0:
        return {"state": "overdue", "text": f"Overdue by {duration(-left)}"}
    state = "soon" if left <= SOON else "ok"
    return {"state": state, "text": f"{duration(left)} left"}


@register.simple_tag
def since(moment: dt.datetime | None, now: dt.datetime | None = None) -> str:
    if moment is None:
        return "—"
    return duration((now or timezone.now()) - moment)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def reason_label(code: str) -> str:
    return presentation.review_reason_label(code or "")


@register.filter
def humanize_code(code: str) -> str:
    return (code or "").replace("_", " ")


@register.simple_tag
def claim_holder(case: Any, user: Any, now: dt.datetime | None = None) -> dict[str, Any]:
    live = services.claim_is_live(case, now)
    return {
        "live": live,
        "mine": live and case.claimed_by_id == user.pk,
        "name": case.claimed_by.get_username() if live and case.claimed_by else "",
        "until": case.claim_expires_at if live else None,
    }


@register.filter
def utc(moment: dt.datetime | None) -> str:
    if moment is None:
        return "—"
    return timezone.localtime(moment).strftime("%d %b %Y, %H:%M:%S UTC")


@register.filter
def hm(moment: dt.datetime | None) -> str:
    """A deadline with its date: "1 Dec 2026, 08:00 UTC"."""
    return services.when(moment)


_REASON_CODE_LABELS = {code: label for codes in services.REASON_CODES.values()
                       for code, label in codes} | dict([services.OTHER_REASON])


@register.filter
def reason_code_label(code: str) -> str:
    return _REASON_CODE_LABELS.get(code, humanize_code(code))


_RESOLUTIONS = {code: label[0].lower() + label[1:]
                for code, label in Case.Resolution.choices}


@register.filter
def resolution_label(code: str) -> str:
    """Case.resolution codes in words (unknown ones humanised)."""
    return _RESOLUTIONS.get(code or "", humanize_code(code))


@register.filter
def action_phrase(action: str) -> str:
    return services.action_phrase(action)


@register.filter
def four_eyes(case: Any) -> bool:
    """Will a decision on this case need a second reviewer? (Known from the amount alone.)"""
    return services.needs_four_eyes(case.operation)
