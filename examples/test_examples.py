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
