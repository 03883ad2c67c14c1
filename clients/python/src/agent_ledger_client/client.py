"""LedgerClient (sync) and AsyncLedgerClient on httpx.

The rules every agent's HTTP client must get right, encoded once:
- a 202 is an answer (in progress / unknown), never an exception;
- timeouts, connection errors, 429 and 5xx re-send the *same* request — the same operation ID —
  with exponential backoff and jitter, honouring Retry-After;
- 422 is final (ParamsConflict with the differing fields); 400/401/403/404 raise at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx

from agent_ledger_client.errors import LedgerUnavailable, problem_for
from agent_ledger_client.models import Lease, Operation, Run, RunPage, ToolInfo
from agent_ledger_client.retry import RETRYABLE_STATUSES, RetryPolicy, parse_retry_after

Execution = Literal["sync", "async", "client"]
OutcomeStatus = Literal["succeeded", "failed", "unknown"]
API = "/api/v1"
MAX_SERVER_WAIT = 30  # the ledger accepts ?wait=0..30
_RETRYABLE_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryEvent:
    """Passed to `on_retry` before each retry: what failed and how long the client waits."""

    method: str
    path: str
    attempt: int
    reason: str  # "timeout", "connection", or the HTTP status ("429", "503", …)
    delay: float
    operation_id: str | None


def _operation_path(operation_id: str) -> str:
    return f"{API}/operations/{quote(operation_id, safe=':~._-')}"


def _submit_body(tool: str, params: Mapping[str, Any], operation_id: str, *,
                 run_id: str | None, tool_call_id: str | None, customer_ref: str | None,
                 execution: Execution) -> dict[str, Any]:
    body: dict[str, Any] = {"operation_id": operation_id, "tool": tool, "params": dict(params)}
    for name, value in (("run_id", run_id), ("tool_call_id", tool_call_id),
                        ("customer_ref", customer_ref)):
        if value:
            body[name] = value
    if execution != "sync":
        body["execution"] = execution
    return body


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}


def _operation(response: httpx.Response, operation_id: str | None) -> Operation:
    if response.status_code not in (200, 201, 202):
        raise problem_for(response.status_code, _body(response), operation_id=operation_id)
    return Operation.from_json(
        response.json(), http_status=response.status_code,
        replayed=response.headers.get("Idempotent-Replayed", "").lower() == "true",
        retry_after=parse_retry_after(response.headers.get("Retry-After")))


def _ok_json(response: httpx.Response, operation_id: str | None = None) -> Any:
    if response.status_code != 200:
        raise problem_for(response.status_code, _body(response), operation_id=operation_id)
    return response.json()


class _Retrying:
    """What both clients share: the retry decision and its bookkeeping."""

    retry: RetryPolicy
    on_retry: Callable[[RetryEvent], None] | None
    _rng: random.Random

    def _next_delay(self, *, method: str, path: str, attempt: int,
                    outcome: httpx.Response | Exception,
                    operation_id: str | None) -> float | None:
        """Seconds to wait before re-sending, or None to stop and let the caller raise."""
        if isinstance(outcome, httpx.Response):
            if outcome.status_code not in RETRYABLE_STATUSES:
                return None
            retry_after = parse_retry_after(outcome.headers.get("Retry-After"))
            if retry_after is not None and retry_after > self.retry.max_retry_after:
                return None
            reason = str(outcome.status_code)
        else:
            retry_after = None
            reason = "timeout" if isinstance(outcome, httpx.TimeoutException) else "connection"
        if attempt >= self.retry.max_attempts:
            return None
        delay = self.retry.delay(attempt, retry_after, self._rng)
        if self.on_retry:
            self.on_retry(RetryEvent(method, path, attempt, reason, delay, operation_id))
        return delay

    @staticmethod
    def _give_up(outcome: httpx.Response | Exception, operation_id: str | None) -> Exception:
        if isinstance(outcome, httpx.Response):
            return problem_for(outcome.status_code, _body(outcome), operation_id=operation_id)
        hint = (f" Submit again with the same operation ID ({operation_id}), never a new one."
                if operation_id else "")
        return LedgerUnavailable(f"No answer from the ledger: {outcome!r}.{hint}",
                                 operation_id=operation_id)


def _headers(token: str, user_agent: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": "application/json",
            "User-Agent": user_agent}


USER_AGENT = "agent-ledger-client-python/0.1"


class LedgerClient(_Retrying):
    """Synchronous client. Thread-safe; use one per process and close it (or `with`)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0,
                 retry: RetryPolicy | None = None,
                 on_retry: Callable[[RetryEvent], None] | None = None,
                 transport: httpx.BaseTransport | None = None, seed: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self._rng = random.Random(seed)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport,
                                  headers=_headers(token, USER_AGENT))

    # --- plumbing ----------------------------------------------------------------------
    def _request(self, method: str, path: str, *, json: Any = None,
                 params: Mapping[str, Any] | None = None, timeout: float | None = None,
                 operation_id: str | None = None) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            outcome: httpx.Response | Exception
            try:
                outcome = self._http.request(
                    method, path, json=json, params=params,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
            except _RETRYABLE_ERRORS as exc:
                outcome = exc
            delay = self._next_delay(method=method, path=path, attempt=attempt, outcome=outcome,
                                     operation_id=operation_id)
            if delay is None:
                if isinstance(outcome, httpx.Response) and \
                        outcome.status_code not in RETRYABLE_STATUSES:
                    return outcome
                raise self._give_up(outcome, operation_id)
            time.sleep(delay)

    # --- operations --------------------------------------------------------------------
    def submit(self, tool: str, params: Mapping[str, Any], *, operation_id: str,
               run_id: str | None = None, tool_call_id: str | None = None,
               customer_ref: str | None = None, execution: Execution = "sync") -> Operation:
        """Record the intent and (with execution="sync") have the ledger send it once.

        Returns the operation for 200 (replay), 201 (done) and 202 (not terminal yet); a
        timeout, a 429 or a 5xx is retried with the same operation ID.
        """
        body = _submit_body(tool, params, operation_id, run_id=run_id, tool_call_id=tool_call_id,
                            customer_ref=customer_ref, execution=execution)
        response = self._request("POST", f"{API}/operations", json=body,
                                 operation_id=operation_id)
        return _operation(response, operation_id)

    def get(self, operation_id: str, *, wait: int | None = None) -> Operation:
        """Read one operation; `wait=N` asks the ledger to hold the answer up to N seconds
        until the status changes (a ledger without long-poll answers at once)."""
        params = None if not wait else {"wait": min(MAX_SERVER_WAIT, int(wait))}
        timeout = None if not (params and self._http.timeout.read) else \
            self._http.timeout.read + params["wait"]
        response = self._request("GET", _operation_path(operation_id), params=params,
                                 timeout=timeout, operation_id=operation_id)
        return _operation(response, operation_id)

    def wait(self, operation_id: str, *, timeout: float = 60.0,
             poll_interval: float | None = None) -> Operation:
        """Wait until the operation is succeeded or failed, or `timeout` passes (then the latest
        non-terminal answer is returned: check `is_terminal`). Long-polls where the ledger
        offers it, else polls at the pace its Retry-After asks for."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            server_wait = int(min(MAX_SERVER_WAIT, max(0.0, remaining)))
            started = time.monotonic()
            operation = self.get(operation_id, wait=server_wait or None)
            if operation.is_terminal or deadline - time.monotonic() <= 0:
                return operation
            if time.monotonic() - started < server_wait / 2 or not server_wait:
                pause = poll_interval or operation.retry_after or 1.0
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))

    def run_page(self, run_id: str, *, limit: int | None = None,
                 after: str | None = None) -> RunPage:
        params = {k: v for k, v in (("limit", limit), ("after", after)) if v is not None}
        response = self._request("GET", f"{API}/runs/{quote(run_id, safe=':~._-')}/operations",
                                 params=params or None)
        return RunPage.from_json(_ok_json(response))

    def run(self, run_id: str, *, page_size: int | None = None) -> Run:
        """Every operation of a run in order (following `next` pages) and the first one not
        yet resolved — where a resumed workflow picks up."""
        page = self.run_page(run_id, limit=page_size)
        operations = list(page.operations)
        first_unresolved = page.first_unresolved
        while page.next:
            page = RunPage.from_json(_ok_json(self._request("GET", page.next)))
            operations.extend(page.operations)
            first_unresolved = first_unresolved or page.first_unresolved
        return Run(run_id=run_id, operations=operations, first_unresolved=first_unresolved)

    def tools(self) -> list[ToolInfo]:
        """The catalogue tools this agent may use."""
        data = _ok_json(self._request("GET", f"{API}/tools"))
        return [ToolInfo.from_json(item) for item in data["tools"]]

    def get_tool(self, name: str) -> ToolInfo:
        return ToolInfo.from_json(_ok_json(self._request("GET", f"{API}/tools/{quote(name)}")))

    # --- client execution --------------------------------------------------------------
    def heartbeat(self, operation_id: str, fencing_token: int) -> Lease:
        response = self._request("POST", f"{_operation_path(operation_id)}/heartbeat",
                                 json={"fencing_token": fencing_token},
                                 operation_id=operation_id)
        return Lease.from_json(_ok_json(response, operation_id))

    def report_outcome(self, operation_id: str, fencing_token: int, status: OutcomeStatus, *,
                       result: Mapping[str, Any] | None = None, provider_reference: str = "",
                       error_class: str = "") -> Operation:
        body = {"fencing_token": fencing_token, "status": status, "result": dict(result or {}),
                "provider_reference": provider_reference, "error_class": error_class}
        response = self._request("POST", f"{_operation_path(operation_id)}/outcome", json=body,
                                 operation_id=operation_id)
        return _operation(response, operation_id)

    def reserve(self, tool: str, params: Mapping[str, Any], *, operation_id: str,
                run_id: str | None = None, tool_call_id: str | None = None,
                customer_ref: str | None = None,
                rejections: tuple[type[BaseException], ...] = (),
                heartbeat_interval: float | None = None) -> Any:
        """`with client.reserve(...) as op:` — see agent_ledger_client.reserve.Reservation."""
        from agent_ledger_client.reserve import Reservation

        return Reservation(self, tool, params, operation_id=operation_id, run_id=run_id,
                           tool_call_id=tool_call_id, customer_ref=customer_ref,
                           rejections=rejections, heartbeat_interval=heartbeat_interval)

    def tool(self, name: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        """`@client.tool("refund")` — see agent_ledger_client.tool.guarded_tool."""
        from agent_ledger_client.tool import guarded_tool

        return lambda function: guarded_tool(self, name, function, **options)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLedgerClient(_Retrying):
    """The same client for asyncio; every method is a coroutine."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0,
                 retry: RetryPolicy | None = None,
                 on_retry: Callable[[RetryEvent], None] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 seed: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self._rng = random.Random(seed)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout,
                                       transport=transport, headers=_headers(token, USER_AGENT))

    async def _request(self, method: str, path: str, *, json: Any = None,
                       params: Mapping[str, Any] | None = None, timeout: float | None = None,
                       operation_id: str | None = None) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            outcome: httpx.Response | Exception
            try:
                outcome = await self._http.request(
                    method, path, json=json, params=params,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
            except _RETRYABLE_ERRORS as exc:
                outcome = exc
            delay = self._next_delay(method=method, path=path, attempt=attempt, outcome=outcome,
                                     operation_id=operation_id)
            if delay is None:
                if isinstance(outcome, httpx.Response) and \
                        outcome.status_code not in RETRYABLE_STATUSES:
                    return outcome
                raise self._give_up(outcome, operation_id)
            await asyncio.sleep(delay)

    async def submit(self, tool: str, params: Mapping[str, Any], *, operation_id: str,
                     run_id: str | None = None, tool_call_id: str | None = None,
                     customer_ref: str | None = None,
                     execution: Execution = "sync") -> Operation:
        body = _submit_body(tool, params, operation_id, run_id=run_id, tool_call_id=tool_call_id,
                            customer_ref=customer_ref, execution=execution)
        response = await self._request("POST", f"{API}/operations", json=body,
                                       operation_id=operation_id)
        return _operation(response, operation_id)

    async def get(self, operation_id: str, *, wait: int | None = None) -> Operation:
        params = None if not wait else {"wait": min(MAX_SERVER_WAIT, int(wait))}
        timeout = None if not (params and self._http.timeout.read) else \
            self._http.timeout.read + params["wait"]
        response = await self._request("GET", _operation_path(operation_id), params=params,
                                       timeout=timeout, operation_id=operation_id)
        return _operation(response, operation_id)

    async def wait(self, operation_id: str, *, timeout: float = 60.0,
                   poll_interval: float | None = None) -> Operation:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            server_wait = int(min(MAX_SERVER_WAIT, max(0.0, remaining)))
            started = loop.time()
            operation = await self.get(operation_id, wait=server_wait or None)
            if operation.is_terminal or deadline - loop.time() <= 0:
                return operation
            if loop.time() - started < server_wait / 2 or not server_wait:
                pause = poll_interval or operation.retry_after or 1.0
                await asyncio.sleep(max(0.0, min(pause, deadline - loop.time())))

    async def run_page(self, run_id: str, *, limit: int | None = None,
                       after: str | None = None) -> RunPage:
        params = {k: v for k, v in (("limit", limit), ("after", after)) if v is not None}
        response = await self._request(
            "GET", f"{API}/runs/{quote(run_id, safe=':~._-')}/operations", params=params or None)
        return RunPage.from_json(_ok_json(response))

    async def run(self, run_id: str, *, page_size: int | None = None) -> Run:
        page = await self.run_page(run_id, limit=page_size)
        operations = list(page.operations)
        first_unresolved = page.first_unresolved
        while page.next:
            page = RunPage.from_json(_ok_json(await self._request("GET", page.next)))
            operations.extend(page.operations)
            first_unresolved = first_unresolved or page.first_unresolved
        return Run(run_id=run_id, operations=operations, first_unresolved=first_unresolved)

    async def tools(self) -> list[ToolInfo]:
        data = _ok_json(await self._request("GET", f"{API}/tools"))
        return [ToolInfo.from_json(item) for item in data["tools"]]

    async def get_tool(self, name: str) -> ToolInfo:
        return ToolInfo.from_json(
            _ok_json(await self._request("GET", f"{API}/tools/{quote(name)}")))

    async def heartbeat(self, operation_id: str, fencing_token: int) -> Lease:
        response = await self._request("POST", f"{_operation_path(operation_id)}/heartbeat",
                                       json={"fencing_token": fencing_token},
                                       operation_id=operation_id)
        return Lease.from_json(_ok_json(response, operation_id))

    async def report_outcome(self, operation_id: str, fencing_token: int,
                             status: OutcomeStatus, *, result: Mapping[str, Any] | None = None,
                             provider_reference: str = "", error_class: str = "") -> Operation:
        body = {"fencing_token": fencing_token, "status": status, "result": dict(result or {}),
                "provider_reference": provider_reference, "error_class": error_class}
        response = await self._request("POST", f"{_operation_path(operation_id)}/outcome",
                                       json=body, operation_id=operation_id)
        return _operation(response, operation_id)

    def reserve(self, tool: str, params: Mapping[str, Any], *, operation_id: str,
                run_id: str | None = None, tool_call_id: str | None = None,
                customer_ref: str | None = None,
                rejections: tuple[type[BaseException], ...] = (),
                heartbeat_interval: float | None = None) -> Any:
        """`async with client.reserve(...) as op:`"""
        from agent_ledger_client.reserve import AsyncReservation

        return AsyncReservation(self, tool, params, operation_id=operation_id, run_id=run_id,
                                tool_call_id=tool_call_id, customer_ref=customer_ref,
                                rejections=rejections, heartbeat_interval=heartbeat_interval)

    def tool(self, name: str, **options: Any) -> Callable[[Callable[..., Awaitable[Any]]], Any]:
        from agent_ledger_client.tool import guarded_tool

        return lambda function: guarded_tool(self, name, function, **options)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
