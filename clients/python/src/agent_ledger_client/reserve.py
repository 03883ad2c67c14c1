"""Client-executed operations: the agent makes the provider call itself, the ledger records it.

    with client.reserve("refund", params, operation_id=oid) as op:
        if op.claimed:                       # this caller won the claim: make the call
            op.result = provider.refund(..., idempotency_key=op.idempotency_key)
    op.operation                             # the ledger's answer after the outcome report

While the block runs, heartbeats extend the lease in the background. On exit the outcome is
reported with the fencing token: a normal exit is `succeeded` (with `op.result` and
`op.provider_reference`); an exception is `unknown` — the call may have reached the provider —
unless it is ProviderRejected or one of `rejections`, the provider's definitive refusals, which
report `failed`. The exception is re-raised either way. If the outcome report cannot reach the
ledger, the lease expires and reconciliation finds out what happened.

When the claim was not won (a replay of a finished operation, or another caller holds it),
`op.claimed` is False, `op.operation` is the current resource, and nothing is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from agent_ledger_client.errors import ProviderRejected, StaleFencingToken
from agent_ledger_client.models import Claim, Operation

if TYPE_CHECKING:
    from agent_ledger_client.client import AsyncLedgerClient, LedgerClient, OutcomeStatus


class _ReservationState:
    operation: Operation
    claim: Claim | None

    def __init__(self, tool: str, params: Mapping[str, Any], *, operation_id: str,
                 run_id: str | None, tool_call_id: str | None, customer_ref: str | None,
                 rejections: tuple[type[BaseException], ...],
                 heartbeat_interval: float | None) -> None:
        self.tool = tool
        self.params = dict(params)
        self.operation_id = operation_id
        self.submit_options = {"run_id": run_id, "tool_call_id": tool_call_id,
                               "customer_ref": customer_ref}
        self.rejections = rejections
        self.heartbeat_interval = heartbeat_interval
        self.claim = None
        self.result: Mapping[str, Any] | None = None
        self.provider_reference = ""
        self.reported = False
        self.lost_claim = False
        self.heartbeats = 0

    @property
    def claimed(self) -> bool:
        """True when this caller holds the claim and must make the provider call."""
        return self.claim is not None

    @property
    def idempotency_key(self) -> str:
        """The key to send to the provider (the same on every attempt for this operation)."""
        if self.claim is None:
            raise RuntimeError("no claim: this caller must not make the provider call")
        return self.claim.idempotency_key

    @property
    def fencing_token(self) -> int:
        if self.claim is None:
            raise RuntimeError("no claim")
        return self.claim.fencing_token

    def _interval(self) -> float:
        if self.heartbeat_interval:
            return self.heartbeat_interval
        expires = self.claim.lease_expires_at if self.claim else None
        if expires is None:
            return 10.0
        # A third of the lease: two heartbeats may be lost before the lease runs out.
        return max(0.5, (expires - datetime.now(UTC)).total_seconds() / 3)

    def _exit_outcome(self, exc: BaseException | None) -> tuple[OutcomeStatus, str]:
        if exc is None:
            return "succeeded", ""
        if isinstance(exc, ProviderRejected):
            return "failed", exc.error_class
        if self.rejections and isinstance(exc, self.rejections):
            return "failed", type(exc).__name__
        # The call may have reached the provider: never "failed" on a guess.
        return "unknown", type(exc).__name__


class Reservation(_ReservationState):
    def __init__(self, client: LedgerClient, tool: str, params: Mapping[str, Any],
                 **options: Any) -> None:
        super().__init__(tool, params, **options)
        self._client = client
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Reservation:
        self.operation = self._client.submit(self.tool, self.params,
                                             operation_id=self.operation_id, execution="client",
                                             **self.submit_options)
        self.claim = self.operation.claim
        if self.claim is not None:
            self._thread = threading.Thread(target=self._beat, daemon=True,
                                            name=f"heartbeat {self.operation_id}")
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self._interval()):
            try:
                lease = self._client.heartbeat(self.operation_id, self.fencing_token)
            except StaleFencingToken:
                self.lost_claim = True
                return
            except Exception:  # noqa: BLE001 - a missed beat is retried at the next interval
                continue
            self.heartbeats += 1
            if self.claim is not None:
                self.claim = Claim(lease.fencing_token, lease.lease_expires_at,
                                   self.claim.idempotency_key)

    def _stop_heartbeats(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def report(self, status: OutcomeStatus, *, result: Mapping[str, Any] | None = None,
               provider_reference: str = "", error_class: str = "") -> Operation:
        """Report the outcome now (the block's exit then reports nothing more)."""
        self._stop_heartbeats()
        self.reported = True
        self.operation = self._client.report_outcome(
            self.operation_id, self.fencing_token, status, result=result,
            provider_reference=provider_reference, error_class=error_class)
        return self.operation

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop_heartbeats()
        if self.claim is None or self.reported:
            return
        status, error_class = self._exit_outcome(exc)
        try:
            self.report(status, result=self.result if status == "succeeded" else None,
                        provider_reference=self.provider_reference, error_class=error_class)
        except Exception:
            if exc is None:
                raise
            # The block's own exception matters more; the lease expiry makes it unknown anyway.


class AsyncReservation(_ReservationState):
    def __init__(self, client: AsyncLedgerClient, tool: str, params: Mapping[str, Any],
                 **options: Any) -> None:
        super().__init__(tool, params, **options)
        self._client = client
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncReservation:
        self.operation = await self._client.submit(
            self.tool, self.params, operation_id=self.operation_id, execution="client",
            **self.submit_options)
        self.claim = self.operation.claim
        if self.claim is not None:
            self._task = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._interval())
            try:
                lease = await self._client.heartbeat(self.operation_id, self.fencing_token)
            except StaleFencingToken:
                self.lost_claim = True
                return
            except Exception:  # noqa: BLE001, S112 - retried at the next interval
                continue
            self.heartbeats += 1
            if self.claim is not None:
                self.claim = Claim(lease.fencing_token, lease.lease_expires_at,
                                   self.claim.idempotency_key)

    async def _stop_heartbeats(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def report(self, status: OutcomeStatus, *, result: Mapping[str, Any] | None = None,
                     provider_reference: str = "", error_class: str = "") -> Operation:
        await self._stop_heartbeats()
        self.reported = True
        self.operation = await self._client.report_outcome(
            self.operation_id, self.fencing_token, status, result=result,
            provider_reference=provider_reference, error_class=error_class)
        return self.operation

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, traceback: TracebackType | None) -> None:
        await self._stop_heartbeats()
        if self.claim is None or self.reported:
            return
        status, error_class = self._exit_outcome(exc)
        try:
            await self.report(status, result=self.result if status == "succeeded" else None,
                              provider_reference=self.provider_reference,
                              error_class=error_class)
        except Exception:
            if exc is None:
                raise
