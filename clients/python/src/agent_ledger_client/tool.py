"""`@client.tool("refund")`: a function signature becomes a guarded tool.

    @ledger.tool("refund")
    def refund(invoice: str, amount: int, currency: str, payee: str, memo: str = "") -> None:
        '''Refund part or all of a paid invoice (amount in minor units).'''

    refund(invoice="invoice-17", amount=2500, currency="EUR", payee="cus_1",
           operation_id="workflow-81:invoice-17:refund-1:v1")   # -> Operation

The wrapper takes the function's parameters as the tool's params plus a required keyword
`operation_id` (documented in its signature and docstring, so agent frameworks that build a
schema from the signature show it to the model). With `operation_id=` a callable, the ID is
built from the params instead and the argument disappears. The ledger sends the call
(`execution="sync"`, or `"async"` for a worker); the body is not run. With
`execution="client"` the body *is* the provider call: it runs inside `client.reserve(...)` only
when this caller wins the claim, receives `idempotency_key=` if it accepts one, and its return
value is reported as the result.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_ledger_client.client import AsyncLedgerClient, LedgerClient

OPERATION_ID_DOC = (
    "operation_id: the stable business identity of this one action, for example "
    "'workflow-81:invoice-17:refund-1:v1'. Reuse exactly the same operation_id whenever you "
    "retry or repeat this same action; never derive it from a tool-call ID and never invent a "
    "new one for an action that is pending or unknown."
)
_HIDDEN = ("tool_call_id", "run_id", "customer_ref")


def _public_signature(function: Callable[..., Any], needs_operation_id: bool) -> inspect.Signature:
    signature = inspect.signature(function)
    parameters = [p for name, p in signature.parameters.items() if name != "idempotency_key"]
    if needs_operation_id:
        parameters.append(inspect.Parameter("operation_id", inspect.Parameter.KEYWORD_ONLY,
                                            annotation=str))
    return signature.replace(parameters=parameters)


def _params(function: Callable[..., Any], args: tuple[Any, ...],
            kwargs: Mapping[str, Any]) -> dict[str, Any]:
    signature = inspect.signature(function)
    bound = signature.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items()
            if value is not None and name != "idempotency_key"}


def _as_result(value: Any) -> dict[str, Any] | None:
    if value is None or isinstance(value, Mapping):
        return None if value is None else dict(value)
    return {"value": value}


def guarded_tool(client: LedgerClient | AsyncLedgerClient, name: str,
                 function: Callable[..., Any], *,
                 operation_id: Callable[[dict[str, Any]], str] | None = None,
                 execution: str = "sync", wait: float = 0.0,
                 returns: str = "operation") -> Callable[..., Any]:
    """Wrap `function` as tool `name` of `client` (see the module docstring).

    wait: seconds to wait for a 202 to resolve before answering. returns: "operation" (the
    typed Operation) or "model" (`Operation.for_model()`, a dict to hand back to an LLM).
    """
    from agent_ledger_client.client import AsyncLedgerClient

    accepts_key = "idempotency_key" in inspect.signature(function).parameters
    signature = _public_signature(function, needs_operation_id=operation_id is None)

    def split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any],
                                                                     dict[str, Any]]:
        options = {key: kwargs.pop(key) for key in _HIDDEN if key in kwargs}
        explicit = kwargs.pop("operation_id", None)
        params = _params(function, args, kwargs)
        op_id = explicit or (operation_id(params) if operation_id else None)
        if not op_id:
            raise TypeError(f"{name}() needs operation_id=")
        return op_id, params, options

    def shaped(op: Any) -> Any:
        return op.for_model() if returns == "model" else op

    if isinstance(client, AsyncLedgerClient):
        aclient = client

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            op_id, params, options = split(args, kwargs)
            if execution == "client":
                async with aclient.reserve(name, params, operation_id=op_id, **options) as res:
                    if res.claimed:
                        extra = {"idempotency_key": res.idempotency_key} if accepts_key else {}
                        res.result = _as_result(await function(**params, **extra))
                op = res.operation
            else:
                op = await aclient.submit(name, params, operation_id=op_id,
                                          execution=execution, **options)  # type: ignore[arg-type]
            if wait and not op.is_terminal:
                op = await aclient.wait(op_id, timeout=wait)
            return shaped(op)

        wrapper: Callable[..., Any] = async_wrapper
    else:
        sclient = client

        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            op_id, params, options = split(args, kwargs)
            if execution == "client":
                with sclient.reserve(name, params, operation_id=op_id, **options) as res:
                    if res.claimed:
                        extra = {"idempotency_key": res.idempotency_key} if accepts_key else {}
                        res.result = _as_result(function(**params, **extra))
                op = res.operation
            else:
                op = sclient.submit(name, params, operation_id=op_id,
                                    execution=execution, **options)  # type: ignore[arg-type]
            if wait and not op.is_terminal:
                op = sclient.wait(op_id, timeout=wait)
            return shaped(op)

        wrapper = sync_wrapper

    functools.update_wrapper(wrapper, function)
    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    annotations = {k: v for k, v in getattr(function, "__annotations__", {}).items()
                   if k != "idempotency_key"}
    if operation_id is None:
        annotations["operation_id"] = "str"
        wrapper.__doc__ = f"{(function.__doc__ or '').rstrip()}\n\n{OPERATION_ID_DOC}".strip()
    wrapper.__annotations__ = annotations
    wrapper.ledger_tool = name  # type: ignore[attr-defined]
    return wrapper
