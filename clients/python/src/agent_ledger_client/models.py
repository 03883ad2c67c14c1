"""Typed results: the operation resource, its claim, a run page, a catalogue tool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Status = Literal["prepared", "in_flight", "succeeded", "failed", "unknown"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed"})


def _when(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


@dataclass(frozen=True)
class Claim:
    """Given to the one caller that won the claim of a client-executed operation."""

    fencing_token: int
    lease_expires_at: datetime | None
    idempotency_key: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Claim | None:
        if not data:
            return None
        return cls(fencing_token=int(data["fencing_token"]),
                   lease_expires_at=_when(data.get("lease_expires_at")),
                   idempotency_key=str(data.get("idempotency_key", "")))


@dataclass(frozen=True)
class Lease:
    operation_id: str
    fencing_token: int
    lease_expires_at: datetime | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lease:
        return cls(operation_id=str(data["operation_id"]), fencing_token=int(data["fencing_token"]),
                   lease_expires_at=_when(data.get("lease_expires_at")))


@dataclass(frozen=True)
class Operation:
    """The ledger's operation resource, plus how this answer arrived (`http_status`,
    `replayed`, `retry_after`)."""

    operation_id: str
    tool: str
    status: Status
    guidance: str
    customer_status: str = ""
    tool_version: int | None = None
    params_hash: str = ""
    attempts: int = 0
    result: Any = None
    error_class: str = ""
    provider_request_id: str = ""
    run_id: str = ""
    subject: str = ""
    value: dict[str, Any] | None = None
    reconciliation: dict[str, Any] | None = None
    status_url: str = ""
    url: str = ""
    claim: Claim | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    sent_at: datetime | None = None
    resolved_at: datetime | None = None
    http_status: int = 200
    replayed: bool = False
    retry_after: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, http_status: int = 200,
                  replayed: bool = False, retry_after: float | None = None) -> Operation:
        version = data.get("tool_version")
        return cls(
            operation_id=str(data["operation_id"]), tool=str(data.get("tool", "")),
            status=data["status"], guidance=str(data.get("guidance", "")),
            customer_status=str(data.get("customer_status", "")),
            tool_version=None if version is None else int(version),
            params_hash=str(data.get("params_hash", "")), attempts=int(data.get("attempts", 0)),
            result=data.get("result"), error_class=str(data.get("error_class") or ""),
            provider_request_id=str(data.get("provider_request_id") or ""),
            run_id=str(data.get("run_id") or ""), subject=str(data.get("subject") or ""),
            value=data.get("value"), reconciliation=data.get("reconciliation"),
            status_url=str(data.get("status_url", "")), url=str(data.get("url", "")),
            claim=Claim.from_json(data.get("claim")),
            created_at=_when(data.get("created_at")), updated_at=_when(data.get("updated_at")),
            sent_at=_when(data.get("sent_at")), resolved_at=_when(data.get("resolved_at")),
            http_status=http_status, replayed=replayed, retry_after=retry_after, raw=dict(data),
        )

    @property
    def is_terminal(self) -> bool:
        """succeeded or failed: the answer will never change."""
        return self.status in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def unknown(self) -> bool:
        """Nobody can tell yet whether it happened: never retry under a new operation ID."""
        return self.status == "unknown"

    def for_model(self) -> dict[str, Any]:
        """A compact answer to hand back to an LLM as the tool result."""
        answer: dict[str, Any] = {"operation_id": self.operation_id, "status": self.status,
                                  "guidance": self.guidance}
        if self.result is not None:
            answer["result"] = self.result
        if self.error_class:
            answer["error_class"] = self.error_class
        if self.replayed:
            answer["replayed"] = True
        if not self.is_terminal:
            answer["retry_with_same_operation_id_only"] = True
        return answer


@dataclass(frozen=True)
class RunPage:
    """One page of a run's operations (`next` is None on the last page)."""

    run_id: str
    count: int
    operations: list[Operation]
    first_unresolved: Operation | None
    next: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunPage:
        first = data.get("first_unresolved")
        return cls(run_id=str(data["run_id"]), count=int(data.get("count", 0)),
                   operations=[Operation.from_json(item) for item in data.get("operations", [])],
                   first_unresolved=Operation.from_json(first) if first else None,
                   next=data.get("next") or None)


@dataclass(frozen=True)
class Run:
    """All of a run's operations (every page followed) and the first one not yet resolved."""

    run_id: str
    operations: list[Operation]
    first_unresolved: Operation | None


@dataclass(frozen=True)
class ToolInfo:
    """A catalogue tool this agent may use (`GET /api/v1/tools`)."""

    name: str
    version: int
    description: str
    params_schema: dict[str, Any]
    intent_fields: list[str] = field(default_factory=list)
    free_text_fields: list[str] = field(default_factory=list)
    secret_fields: list[str] = field(default_factory=list)
    value: dict[str, str] | None = None
    high_value_thresholds: dict[str, int] = field(default_factory=dict)
    four_eyes_thresholds: dict[str, int] = field(default_factory=dict)
    client_execution: bool = True

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolInfo:
        return cls(
            name=str(data["name"]), version=int(data.get("version", 1)),
            description=str(data.get("description", "")),
            params_schema=dict(data.get("params_schema") or {"type": "object"}),
            intent_fields=list(data.get("intent_fields", [])),
            free_text_fields=list(data.get("free_text_fields", [])),
            secret_fields=list(data.get("secret_fields", [])),
            value=data.get("value"),
            high_value_thresholds=dict(data.get("high_value_thresholds") or {}),
            four_eyes_thresholds=dict(data.get("four_eyes_thresholds") or {}),
            client_execution=bool(data.get("client_execution", True)),
        )
