"""The worked examples, each with a scripted model, against a live ledger: a regenerated tool
call (new tool-call ID, reworded memo) is answered as a replay, with one effect at the provider."""

from __future__ import annotations


def test_openai_agents_function_tool(ledger, workflow_id):
    import openai_agents_refund

    summary = openai_agents_refund.main(ledger.url, ledger.token, ledger.sandbox_url, workflow_id)
    first, second = summary["answers"]
    assert first["status"] == "succeeded" and "replayed" not in first
    assert second["status"] == "succeeded" and second["replayed"] is True
    assert summary["effects"] == 1


def test_pydantic_ai_defers_on_202_and_resumes_with_the_same_id(ledger, workflow_id):
    import pydantic_ai_refund

    summary = pydantic_ai_refund.main(ledger.url, ledger.token, ledger.sandbox_url, workflow_id)
    assert summary["deferred"] == ["call_Ab12Cd34Ef56"]
    assert summary["resumed"]["status"] == "succeeded"
    assert summary["regenerated"]["status"] == "succeeded"
    assert summary["regenerated"]["replayed"] is True
    assert summary["effects"] == 1


def test_langgraph_interrupts_on_unknown_and_resumes_with_the_same_id(ledger, workflow_id):
    import langgraph_refund

    summary = langgraph_refund.main(ledger.url, ledger.token, ledger.sandbox_url, workflow_id)
    (paused,) = summary["interrupted"]
    assert paused["operation_id"] == summary["operation_id"]
    assert paused["status"] == "unknown" and paused["retry_with_same_operation_id_only"] is True
    assert summary["resumed"]["status"] == "succeeded"
    assert summary["regenerated"]["status"] == "succeeded"
    assert summary["regenerated"]["replayed"] is True
    assert summary["effects"] == 1
