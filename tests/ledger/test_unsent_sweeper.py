from __future__ import annotations

from ledger import executor
from ledger.models import Operation
from tests.conftest import refund_params

OP = "wf-81:invoice-17:refund-1:v1"


def test_refused_then_swept_sends_once_after_the_backoff(
    agent, sandbox, sandbox_server, refused_provider, settings, frozen
):
    executor.submit(agent=agent, operation_id=OP, tool_name="refund", params=refund_params())
    assert Operation.objects.get().status == "prepared"
    settings.SANDBOX_URL = sandbox_server.url

    assert executor.retry_unsent() == 0  # too soon: nothing sent
    assert sandbox.request_counts()["total"] == 0

    frozen.shift(11)
    assert executor.retry_unsent() == 1
    assert executor.retry_unsent() == 0

    operation = Operation.objects.get()
    assert operation.status == "succeeded" and operation.attempts == 2
    assert sandbox.effect_counts() == {OP: 1}


def test_queued_async_operation_whose_message_was_lost_is_swept(agent, sandbox, frozen):
    executor.submit(agent=agent, operation_id=OP, tool_name="refund", params=refund_params(),
                    execute=False)
    frozen.shift(11)

    assert executor.retry_unsent() == 1
    assert Operation.objects.get().status == "succeeded"
    assert sandbox.effect_counts() == {OP: 1}
