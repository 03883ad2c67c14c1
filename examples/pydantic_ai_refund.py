"""Pydantic AI: a tool guarded by Agent Ledger, deferred while the ledger answers 202.

The model is scripted with pydantic_ai's FunctionModel (no network LLM). The first call's
provider response is lost (the sandbox's `sandbox:lose-response`), so the ledger answers 202
`unknown`: the tool raises CallDeferred and the run ends with DeferredToolRequests instead of
handing the model a failure it would retry under a new ID. The application waits for the ledger
to resolve the same operation ID and resumes the run with the result. Later the model regenerates
the call — new tool-call ID, reworded memo — and the ledger answers it as a replay: one effect.

    LEDGER_URL=… LEDGER_TOKEN=… SANDBOX_URL=… \
        examples/.venv/bin/python examples/pydantic_ai_refund.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from _common import effects, settings
from agent_ledger_client import LedgerClient, operation_id
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


@dataclass
class Deps:
    workflow_id: str
    ledger: LedgerClient


agent = Agent(deps_type=Deps, output_type=[str, DeferredToolRequests])


# --- the guarded tool: ten lines ---------------------------------------------------------
@agent.tool
def refund(ctx: RunContext[Deps], invoice: str, amount: int, currency: str, payee: str,
           memo: str) -> dict[str, Any]:
    """Refund part or all of a paid invoice. amount is in minor units (2500 = 25.00)."""
    oid = operation_id(workflow=ctx.deps.workflow_id, subject=invoice, action="refund", sequence=1)
    op = ctx.deps.ledger.submit("refund", {"invoice": invoice, "amount": amount, "currency":
                                           currency, "payee": payee, "memo": memo},
                                operation_id=oid, tool_call_id=ctx.tool_call_id)
    if not op.is_terminal:  # 202: pending or unknown — defer, never fail
        raise CallDeferred(metadata={"operation_id": oid})
    return op.for_model()
# -----------------------------------------------------------------------------------------


def scripted(call_id: str, memo: str):
    """A FunctionModel script: call refund once, then answer with what the tool returned."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [part for message in messages for part in getattr(message, "parts", [])
                   if isinstance(part, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(json.dumps(returns[-1].content))])
        args = {"invoice": "invoice-17", "amount": 2500, "currency": "EUR", "payee": "cus_123",
                "memo": memo}
        return ModelResponse(parts=[ToolCallPart("refund", args, tool_call_id=call_id)])

    return FunctionModel(model)


def main(url: str, token: str, sandbox_url: str, workflow_id: str = "workflow-83") -> dict:
    with LedgerClient(url, token) as ledger:
        deps = Deps(workflow_id, ledger)
        first = agent.run_sync("Refund invoice-17", deps=deps, model=scripted(
            "call_Ab12Cd34Ef56", "sandbox:lose-response"))  # the provider answer is lost
        oid = operation_id(workflow=workflow_id, subject="invoice-17", action="refund",
                           sequence=1)
        deferred = []
        resumed = first  # already resolved (this example ran before on this ledger): a replay
        if isinstance(first.output, DeferredToolRequests):  # the ledger said 202
            call = first.output.calls[0]
            deferred.append(call.tool_call_id)
            resolved = ledger.wait(oid, timeout=300)  # the same ID, never a new one
            resumed = agent.run_sync(
                deps=deps, model=scripted("unused", "unused"),
                message_history=first.all_messages(),
                deferred_tool_results=DeferredToolResults(calls={call.tool_call_id:
                                                                 resolved.for_model()}))
        regenerated = agent.run_sync("Refund invoice-17", deps=deps, model=scripted(
            "call_Zz98Yy76Xx54", "The customer's parcel arrived broken"))
        return {"operation_id": oid, "deferred": deferred,
                "resumed": json.loads(resumed.output), "regenerated": json.loads(
                    regenerated.output), "effects": effects(sandbox_url, oid)}


if __name__ == "__main__":
    print(json.dumps(main(*settings()), indent=2))
