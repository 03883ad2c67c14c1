"""Tool discovery (GET /api/v1/tools) against the live ledger."""

from __future__ import annotations

import pytest
from agent_ledger_client import LedgerClient, NotFound


def test_tools_lists_what_this_agent_may_use_with_schemas(client):
    tools = {tool.name: tool for tool in client.tools()}
    assert {"refund", "send_email", "create_ticket"} <= set(tools)
    refund = tools["refund"]
    assert refund.params_schema["type"] == "object"
    assert {"invoice", "amount", "currency", "payee"} <= set(refund.intent_fields)
    assert "memo" in refund.free_text_fields
    assert refund.value == {"amount_field": "amount", "currency_field": "currency"}


def test_a_narrow_agent_sees_only_its_tools(ledger):
    with LedgerClient(ledger.url, ledger.tokens["narrow"]) as narrow:
        assert [tool.name for tool in narrow.tools()] == ["send_email"]
        with pytest.raises(NotFound):
            narrow.get_tool("refund")


def test_get_tool_returns_one_resource(client):
    tool = client.get_tool("send_email")
    assert tool.name == "send_email" and tool.version >= 1 and tool.value is None
