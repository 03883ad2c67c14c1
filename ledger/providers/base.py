"""One interface and one outcome vocabulary for every provider adapter.

Adapters classify every exception themselves. The executor never inspects an exception: it
only sees one of the outcomes below, and each outcome maps to exactly one ledger transition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ledger.models import Operation


@dataclass(frozen=True)
class Confirmed:
    """The provider executed the action (or replayed the original execution)."""

    result: dict[str, Any]
    provider_request_id: str
    replayed: bool = False


@dataclass(frozen=True)
class Rejected:
    """The provider's contract says nothing happened, and repeating will not change that."""

    error_class: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NotSent:
    """The request provably never reached the provider (connect refused, DNS, pool timeout),
    or the provider refused it before executing anything (a rate limit, with its Retry-After)."""

    error_class: str
    retry_after_seconds: float | None = None


class UnknownReason(StrEnum):
    """Why nobody can tell; a reconciliation case opens with this reason."""

    TIMEOUT_AFTER_SEND = "timeout_after_send"
    CONNECTION_RESET = "connection_reset"
    AMBIGUOUS_5XX = "ambiguous_5xx"
    PROVIDER_IN_PROGRESS = "provider_in_progress"
    KEY_REUSED = "key_reused"  # our key is stored at the provider with other params
    AMBIGUOUS_RESPONSE = "ambiguous_response"


@dataclass(frozen=True)
class Unknown:
    """The request may have reached the provider and nobody can say what it did."""

    error_class: str
    reason: UnknownReason = UnknownReason.AMBIGUOUS_RESPONSE

    @property
    def in_progress(self) -> bool:
        return self.reason is UnknownReason.PROVIDER_IN_PROGRESS


SendOutcome = Confirmed | Rejected | NotSent | Unknown


@dataclass(frozen=True)
class Found:
    fields: dict[str, Any]
    provider_request_id: str
    status: str
    matches: int = 1
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NotFound:
    pass


@dataclass(frozen=True)
class Unavailable:
    error_class: str


LookupOutcome = Found | NotFound | Unavailable


@dataclass(frozen=True)
class Capabilities:
    honours_idempotency_keys: bool
    key_retention_seconds: int | None
    lookup_by_request_id: bool
    lookup_by_key: bool
    lookup_by_reference: bool
    lookup_consistency_seconds: float
    authoritative_absence: bool
    # False for a lookup-only connector: the client executes (issue 8), the ledger only checks.
    can_send: bool = True

    @property
    def can_lookup(self) -> bool:
        return self.lookup_by_request_id or self.lookup_by_key or self.lookup_by_reference


class ProviderAdapter(Protocol):
    name: str
    capabilities: Capabilities

    def send(self, operation: Operation, *, key: str, timeout: float) -> SendOutcome: ...

    def lookup(self, operation: Operation, *, timeout: float) -> LookupOutcome: ...

    def lookup_query(self, operation: Operation) -> dict[str, str]:
        """What `lookup` will ask the provider for this operation (kept as evidence)."""
        ...
