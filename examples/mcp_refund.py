"""An MCP host using `agent-ledger-mcp`: guarded tools with no code in the agent at all.

The real `mcp` client launches the server over stdio (as Claude Desktop, an IDE or any MCP host
would) and a scripted "model" makes the tool calls: a refund whose provider response is lost
(the server's structured answer says: unknown, do not retry under a new ID), polling with
get_operation as told, then the same refund regenerated with a reworded memo — a replay. The
provider's effects log shows one refund.

    LEDGER_URL=… LEDGER_TOKEN=… SANDBOX_URL=… \
        examples/.venv/bin/python examples/mcp_refund.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio
from _common import effects, settings
from mcp import Client, StdioServerParameters


def server(url: str, token: str) -> StdioServerParameters:
    """How an MCP host's configuration would launch it."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "agent_ledger_client.mcp_server"],
        env={**os.environ, "LEDGER_URL": url, "LEDGER_TOKEN": token})


def answer(result: Any) -> dict:
    return dict(result.structured_content)


async def run(url: str, token: str, sandbox_url: str, workflow_id: str) -> dict:
    oid = f"{workflow_id}:invoice-17:refund-1:v1"  # the model is told to build it from keys
    refund = {"operation_id": oid, "invoice": "invoice-17", "amount": 2500, "currency": "EUR",
              "payee": "cus_123"}
    async with Client(server(url, token)) as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
        first = answer(await mcp.call_tool("refund", refund | {"memo": "sandbox:lose-response"}))
        polled = first
        deadline = time.monotonic() + 120
        while polled["status"] not in {"succeeded", "failed"} and time.monotonic() < deadline:
            await anyio.sleep(1)  # as the answer said: poll the same ID, never a new one
            polled = answer(await mcp.call_tool("get_operation", {"operation_id": oid}))
        regenerated = answer(await mcp.call_tool(
            "refund", refund | {"memo": "The customer's parcel arrived broken"}))
    return {"operation_id": oid, "tools": sorted(tools),
            "refund_annotations": tools["refund"].annotations.model_dump(exclude_none=True),
            "first": first, "polled": polled, "regenerated": regenerated,
            "effects": effects(sandbox_url, oid)}


def main(url: str, token: str, sandbox_url: str, workflow_id: str = "workflow-84") -> dict:
    return anyio.run(run, url, token, sandbox_url, workflow_id)


if __name__ == "__main__":
    print(json.dumps(main(*settings()), indent=2, default=str))
