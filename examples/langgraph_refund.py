"""LangGraph: a tool node guarded by Agent Ledger that interrupt()s on an unknown outcome and
resumes with the same operation ID.

The model is langchain_core's GenericFakeChatModel with a script (no network LLM). The first
refund's provider response is lost (`sandbox:lose-response`), so the ledger answers 202
`unknown`: the tool node calls interrupt() instead of reporting a failure. The application waits
for the ledger and resumes the thread; LangGraph re-runs the node from its start, which submits
the same operation ID again — now answered from the ledger. A second thread regenerates the call
(new tool-call ID, reworded memo): a replay. The provider's effects log shows one refund.

    LEDGER_URL=… LEDGER_TOKEN=… SANDBOX_URL=… \
        examples/.venv/bin/python examples/langgraph_refund.py
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

from _common import effects, settings
from agent_ledger_client import LedgerClient, operation_id
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt


class State(TypedDict):
    workflow_id: str
    messages: Annotated[list[AnyMessage], add_messages]


def build(ledger: LedgerClient, model: GenericFakeChatModel) -> Any:
    def agent(state: State) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    # --- the guarded tool node: ten lines ------------------------------------------------
    def refund(state: State) -> dict:
        call = state["messages"][-1].tool_calls[0]
        oid = operation_id(workflow=state["workflow_id"], subject=call["args"]["invoice"],
                           action="refund", sequence=1)
        op = ledger.submit("refund", call["args"], operation_id=oid, tool_call_id=call["id"])
        if not op.is_terminal:  # unknown or pending: pause the graph, never fail or re-ID
            interrupt(op.for_model())
        return {"messages": [ToolMessage(json.dumps(op.for_model()), tool_call_id=call["id"])]}
    # -------------------------------------------------------------------------------------

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "refund" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("refund", refund)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["refund", END])
    graph.add_edge("refund", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def scripted(call_id: str, memo: str) -> GenericFakeChatModel:
    args = {"invoice": "invoice-17", "amount": 2500, "currency": "EUR", "payee": "cus_123",
            "memo": memo}
    return GenericFakeChatModel(messages=iter([
        AIMessage("", tool_calls=[{"name": "refund", "args": args, "id": call_id}]),
        AIMessage("The refund is recorded."),
    ]))


def main(url: str, token: str, sandbox_url: str, workflow_id: str = "workflow-82") -> dict:
    oid = operation_id(workflow=workflow_id, subject="invoice-17", action="refund", sequence=1)
    start = {"workflow_id": workflow_id, "messages": [("user", "Refund invoice-17")]}
    with LedgerClient(url, token) as ledger:
        graph = build(ledger, scripted("call_Ab12Cd34Ef56", "sandbox:lose-response"))
        thread = {"configurable": {"thread_id": f"{workflow_id}-1"}}
        paused = graph.invoke(start, thread)
        interrupted = [i.value for i in paused.get("__interrupt__", [])]
        resumed = paused  # no interrupt: already resolved (a re-run of this example)
        if interrupted:
            ledger.wait(oid, timeout=300)  # the ledger resolves the same ID; never a new one
            resumed = graph.invoke(Command(resume=True), thread)
        regenerated_graph = build(ledger, scripted("call_Zz98Yy76Xx54",
                                                   "The customer's parcel arrived broken"))
        regenerated = regenerated_graph.invoke(start, {"configurable": {
            "thread_id": f"{workflow_id}-2"}})

    def tool_answer(state: dict) -> dict:
        return json.loads(next(m.content for m in state["messages"] if isinstance(m, ToolMessage)))

    return {"operation_id": oid, "interrupted": interrupted, "resumed": tool_answer(resumed),
            "regenerated": tool_answer(regenerated), "effects": effects(sandbox_url, oid)}


if __name__ == "__main__":
    print(json.dumps(main(*settings()), indent=2))
