"""`agent-ledger-mcp` driven by the real `mcp` client over stdio and streamable HTTP (an MCP
client lists the tools, from GET /api/v1/tools, before calling one)."""

from __future__ import annotations

import pytest
from agent_ledger_client import operation_id
from conftest import refund_params
from mcp_helpers import connect, structured

pytestmark = pytest.mark.anyio


async def test_a_regenerated_call_through_mcp_is_a_replay_with_one_effect(ledger, unique):
    oid = operation_id(workflow=unique, subject="invoice-80", action="refund", sequence=1)
    async with connect(ledger.url, ledger.token) as mcp:
        first = await mcp.call_tool("refund", {"operation_id": oid,
                                               **refund_params("invoice-80", memo="Damaged")})
        again = await mcp.call_tool("refund", {"operation_id": oid,
                                               **refund_params("invoice-80", memo="Broken")})
    assert not first.is_error and structured(first)["status"] == "succeeded"
    assert structured(again)["replayed"] is True
    assert ledger.effect_counts().get(oid) == 1


async def test_an_unknown_outcome_tells_the_model_not_to_retry_under_a_new_id(ledger, unique):
    oid = operation_id(workflow=unique, subject="invoice-81", action="refund", sequence=1)
    async with connect(ledger.url, ledger.token) as mcp:
        result = await mcp.call_tool("refund", {
            "operation_id": oid, **refund_params("invoice-81", memo="sandbox:lose-response")})
        answer = structured(result)
        assert result.is_error is False  # an answer, not a failure the model would retry
        assert answer["status"] == "unknown"
        assert answer["do_not_retry_with_new_operation_id"] is True
        assert "Do NOT call this tool again with a new operation_id" in result.content[0].text
        read = await mcp.call_tool("get_operation", {"operation_id": oid})
    assert structured(read)["operation_id"] == oid


async def test_a_tool_call_id_as_operation_id_is_refused_before_anything_is_sent(ledger):
    async with connect(ledger.url, ledger.token) as mcp:
        result = await mcp.call_tool("refund", {"operation_id": "call_aB3dE5fG7hJ9k",
                                                **refund_params("invoice-82")})
    assert result.is_error and structured(result)["error"] == "UnsafeOperationId"
    assert "call_aB3dE5fG7hJ9k" not in ledger.effect_counts()


async def test_a_changed_intent_returns_the_differences(ledger, unique):
    oid = operation_id(workflow=unique, subject="invoice-83", action="refund", sequence=1)
    async with connect(ledger.url, ledger.token) as mcp:
        await mcp.call_tool("refund", {"operation_id": oid, **refund_params("invoice-83")})
        result = await mcp.call_tool("refund", {"operation_id": oid,
                                                **refund_params("invoice-83", amount=99)})
    answer = structured(result)
    assert result.is_error and answer["code"] == "params_conflict"
    assert answer["differences"]["amount"] == {"stored": 2500, "submitted": 99}


async def test_list_run_shows_the_first_unresolved(ledger, unique):
    async with connect(ledger.url, ledger.token, "--run-id", unique) as mcp:
        done = operation_id(workflow=unique, subject="invoice-84", action="refund", sequence=1)
        pending = operation_id(workflow=unique, subject="invoice-85", action="refund", sequence=1)
        await mcp.call_tool("refund", {"operation_id": done, **refund_params("invoice-84")})
        await mcp.call_tool("refund", {"operation_id": pending, **refund_params(
            "invoice-85", memo="sandbox:rate-limit")})
        answer = structured(await mcp.call_tool("list_run", {"run_id": unique}))
    assert [op["operation_id"] for op in answer["operations"]] == [done, pending]
    assert answer["first_unresolved"]["operation_id"] == pending


async def test_every_allowed_catalogue_tool_is_listed_with_a_required_operation_id(ledger):
    async with connect(ledger.url, ledger.token) as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    assert {"refund", "send_email", "create_ticket", "get_operation", "list_run"} <= set(tools)
    refund = tools["refund"]
    assert refund.input_schema["required"][0] == "operation_id"
    assert {"invoice", "amount", "currency", "payee"} <= set(refund.input_schema["required"])
    assert "tool-call ID" in refund.input_schema["properties"]["operation_id"]["description"]
    assert refund.annotations.destructive_hint is True
    assert refund.annotations.idempotent_hint is True
    for name in ("get_operation", "list_run"):
        assert tools[name].annotations.read_only_hint is True


async def test_a_narrow_agent_gets_only_its_tools(ledger):
    async with connect(ledger.url, ledger.tokens["narrow"]) as mcp:
        names = {tool.name for tool in (await mcp.list_tools()).tools}
    assert names == {"send_email", "get_operation", "list_run"}


async def test_streamable_http_transport_serves_the_same_tools(ledger, unique):
    import subprocess
    import sys
    import time

    import httpx
    from live_instance import free_port
    from mcp import Client

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "agent_ledger_client.mcp_server", "--transport",
         "streamable-http", "--port", str(port), "--url", ledger.url, "--token", ledger.token],
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        oid = operation_id(workflow=unique, subject="invoice-86", action="refund", sequence=1)
        async with Client(f"http://127.0.0.1:{port}/mcp") as mcp:
            assert "refund" in {t.name for t in (await mcp.list_tools()).tools}
            result = await mcp.call_tool("refund", {"operation_id": oid,
                                                    **refund_params("invoice-86")})
        assert structured(result)["status"] == "succeeded"
        assert ledger.effect_counts().get(oid) == 1
    finally:
        server.terminate()
        server.wait(timeout=10)
