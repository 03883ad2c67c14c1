"""The MCP host example (an MCP host lists the tools, from GET /api/v1/tools, first)."""

from __future__ import annotations


def test_mcp_host_gets_guarded_tools_and_a_regenerated_call_is_a_replay(ledger, workflow_id):
    import mcp_refund

    summary = mcp_refund.main(ledger.url, ledger.token, ledger.sandbox_url, workflow_id)
    assert {"refund", "get_operation", "list_run"} <= set(summary["tools"])
    assert summary["refund_annotations"]["destructive_hint"] is True
    assert summary["refund_annotations"]["idempotent_hint"] is True
    assert summary["first"]["status"] == "unknown"
    assert summary["first"]["do_not_retry_with_new_operation_id"] is True
    assert summary["polled"]["status"] == "succeeded"
    assert summary["regenerated"]["replayed"] is True
    assert summary["effects"] == 1
