"""The tool registry: every side-effecting tool an agent may call, declared in code."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Field:
    kind: type  # int or str
    required: bool = True
    max_length: int = 500
    minimum: int | None = None
    maximum: int | None = None
    pattern: str | None = None
    choices: tuple[str, ...] | None = None

    def check(self, value: Any) -> str | None:
        """Return an error message, or None when the value is acceptable."""
        if self.kind is int:
            if isinstance(value, float | Decimal):
                return "must be an integer in minor units; decimals and floats are not accepted"
            if not isinstance(value, int) or isinstance(value, bool):
                return "must be an integer"
            if self.minimum is not None and value < self.minimum:
                return f"must be at least {self.minimum}"
            if self.maximum is not None and value > self.maximum:
                return f"must be at most {self.maximum}"
            return None
        if not isinstance(value, str):
            return "must be a string"
        if len(value) > self.max_length:
            return f"must be at most {self.max_length} characters"
        if self.pattern and not re.fullmatch(self.pattern, value):
            return "has an invalid format"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        return None


@dataclass(frozen=True)
class Tool:
    name: str
    version: int
    description: str
    schema: Mapping[str, Field]
    intent_fields: tuple[str, ...]
    provider: str
    provider_kind: str
    value: Callable[[Mapping[str, Any]], tuple[int, str] | None]
    subject: Callable[[Mapping[str, Any]], str]
    high_value_threshold: int | None = None
    four_eyes_threshold: int | None = None
    lease_seconds: int = 60
    request_timeout: float = 10.0
    secret_fields: tuple[str, ...] = field(default=())
    # A setting that, when set, names the provider instead. It is read whenever the tool is
    # looked up, and each operation stores the provider it was recorded with.
    provider_setting: str = ""

    def configured(self) -> Tool:
        """This tool with its provider as configured now (still a plain string)."""
        if not self.provider_setting:
            return self
        chosen = str(getattr(settings, self.provider_setting, "") or "")
        if not chosen or chosen == self.provider:
            return self
        from ledger.providers import get_adapter

        try:
            get_adapter(chosen)
        except KeyError:
            # Refused before anything is written, not after a row was claimed for it.
            raise ImproperlyConfigured(
                f"{self.provider_setting}={chosen!r} names no registered provider"
            ) from None
        return replace(self, provider=chosen)

    def validate(self, params: Any) -> dict[str, str]:
        """Field-level errors; an empty dict means the params are acceptable."""
        if not isinstance(params, Mapping):
            return {"params": "must be a JSON object"}
        errors = {
            name: f"unknown field for {self.name}"
            for name in params
            if name not in self.schema
        }
        for name, spec in self.schema.items():
            if name not in params or params[name] is None:
                if spec.required:
                    errors[name] = "is required"
                continue
            message = spec.check(params[name])
            if message:
                errors[name] = message
        return errors

    def intent(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {name: params[name] for name in self.intent_fields if name in params}

    def redacted(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {k: ("[redacted]" if k in self.secret_fields else v) for k, v in params.items()}

    def is_high_value(self, amount: int | None) -> bool:
        return self._at_or_above(amount, self.high_value_threshold)

    def needs_four_eyes(self, amount: int | None) -> bool:
        return self._at_or_above(amount, self.four_eyes_threshold)

    @staticmethod
    def _at_or_above(amount: int | None, threshold: int | None) -> bool:
        return amount is not None and threshold is not None and amount >= threshold


class UnknownTool(LookupError):
    pass


_CURRENCY = r"[A-Z]{3}"
_REFERENCE = r"[A-Za-z0-9._:~-]{1,100}"

REFUND = Tool(
    name="refund",
    version=1,
    description="Refund part or all of a paid invoice to the payee.",
    schema={
        "invoice": Field(str, pattern=_REFERENCE),
        "amount": Field(int, minimum=1, maximum=10_000_000_00),
        "currency": Field(str, pattern=_CURRENCY),
        "payee": Field(str, max_length=200),
        "memo": Field(str, required=False, max_length=1000),
    },
    intent_fields=("invoice", "amount", "currency", "payee"),
    provider="sandbox",
    provider_setting="LEDGER_REFUND_PROVIDER",
    provider_kind="refund",
    value=lambda p: (p["amount"], p["currency"]),
    subject=lambda p: p["invoice"],
    high_value_threshold=100_000,  # 1,000.00 in minor units
    four_eyes_threshold=1_000_000,  # 10,000.00
    lease_seconds=60,
    request_timeout=10.0,
)

SEND_EMAIL = Tool(
    name="send_email",
    version=1,
    description="Send one templated e-mail to a customer.",
    schema={
        "to": Field(str, max_length=254, pattern=r"[^@\s]+@[^@\s]+"),
        "template": Field(str, pattern=r"[a-z0-9_-]{1,64}"),
        "subject": Field(str, max_length=200),
        "body": Field(str, required=False, max_length=20_000),
    },
    intent_fields=("to", "template", "subject"),
    provider="sandbox",
    provider_setting="LEDGER_EMAIL_PROVIDER",
    provider_kind="email",
    value=lambda p: None,
    subject=lambda p: p["to"],
    lease_seconds=30,
    request_timeout=10.0,
)

CREATE_TICKET = Tool(
    name="create_ticket",
    version=1,
    description="Open a support ticket (the ticketing API takes no idempotency keys).",
    schema={
        "queue": Field(str, pattern=r"[a-z0-9_-]{1,64}"),
        "customer": Field(str, pattern=_REFERENCE),
        "title": Field(str, max_length=200),
        "description": Field(str, required=False, max_length=20_000),
    },
    intent_fields=("queue", "customer", "title"),
    provider="sandbox-nokeys",
    provider_kind="ticket",
    value=lambda p: None,
    subject=lambda p: p["customer"],
    lease_seconds=30,
    request_timeout=10.0,
)


class _Registry(Mapping[str, Tool]):
    """Tools by name, each read with its provider as configured at that moment."""

    def __init__(self, *tools: Tool) -> None:
        self._tools = {tool.name: tool for tool in tools}

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name].configured()

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)


REGISTRY: Mapping[str, Tool] = _Registry(REFUND, SEND_EMAIL, CREATE_TICKET)


def get_tool(name: str) -> Tool:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownTool(name) from None
