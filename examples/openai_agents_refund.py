"""OpenAI Agents SDK: a function tool guarded by Agent Ledger.

The model is scripted (no network LLM): a custom `Model` that first calls `refund`, then answers
with text. The second run is the same request regenerated — a new tool-call ID and a reworded
memo — and the ledger answers it as a replay: one refund in the provider's effects log.

    LEDGER_URL=… LEDGER_TOKEN=… SANDBOX_URL=… \
        examples/.venv/bin/python examples/openai_agents_refund.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from _common import effects, settings
from agent_ledger_client import LedgerClient, operation_id
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


@dataclass
class Workflow:
    """The application's run context: the workflow is a business key, chosen by the app."""

    workflow_id: str
    ledger: LedgerClient


# --- the guarded tool: ten lines ---------------------------------------------------------
@function_tool
def refund(ctx: ToolContext[Workflow], invoice: str, amount: int, currency: str, payee: str,
           memo: str) -> str:
    """Refund part or all of a paid invoice. amount is in minor units (2500 = 25.00)."""
    oid = operation_id(workflow=ctx.context.workflow_id, subject=invoice, action="refund",
                       sequence=1)
    op = ctx.context.ledger.submit(
        "refund", {"invoice": invoice, "amount": amount, "currency": currency, "payee": payee,
                   "memo": memo}, operation_id=oid, tool_call_id=ctx.tool_call_id)
    return json.dumps(op.for_model())  # a 202 is an answer too: it tells the model to wait
# -----------------------------------------------------------------------------------------


class ScriptedModel(Model):
    """Stands in for the LLM: one tool call, then a short answer quoting the tool's output."""

    def __init__(self, call_id: str, arguments: dict[str, Any]) -> None:
        self.call_id = call_id
        self.arguments = arguments

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        items = input if isinstance(input, list) else []
        outputs = [item for item in items
                   if isinstance(item, dict) and item.get("type") == "function_call_output"]
        if outputs:
            text = ResponseOutputText(type="output_text", text=str(outputs[-1]["output"]),
                                      annotations=[])
            message = ResponseOutputMessage(id="msg_1", type="message", role="assistant",
                                            status="completed", content=[text])
            return ModelResponse(output=[message], usage=Usage(), response_id=None)
        call = ResponseFunctionToolCall(type="function_call", id=f"fc_{self.call_id}",
                                        call_id=self.call_id, name="refund",
                                        arguments=json.dumps(self.arguments), status="completed")
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def main(url: str, token: str, sandbox_url: str, workflow_id: str = "workflow-81") -> dict:
    set_tracing_disabled(True)  # no trace export: nothing leaves this machine
    request = {"invoice": "invoice-17", "amount": 2500, "currency": "EUR", "payee": "cus_123"}
    answers = []
    with LedgerClient(url, token) as ledger:
        context = Workflow(workflow_id, ledger)
        for call_id, memo in (("call_Ab12Cd34Ef56", "Damaged parcel"),
                              ("call_Zz98Yy76Xx54", "The customer's parcel arrived broken")):
            agent = Agent(name="support", instructions="Refund damaged orders.", tools=[refund],
                          model=ScriptedModel(call_id, request | {"memo": memo}))
            result = Runner.run_sync(agent, "Please refund invoice-17", context=context)
            answers.append(json.loads(result.final_output))
        oid = operation_id(workflow=workflow_id, subject="invoice-17", action="refund", sequence=1)
        return {"operation_id": oid, "answers": answers, "effects": effects(sandbox_url, oid)}


if __name__ == "__main__":
    print(json.dumps(main(*settings()), indent=2))
