"""A ledger that throttles this agent (LEDGER_AGENT_RATE=2/s): the 429 is retried with the same
operation ID after Retry-After, and the action happens once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_ledger_client import LedgerClient, NotFound, RetryPolicy, Throttled, operation_id
from conftest import refund_params
from live_instance import LiveInstance


@pytest.fixture(scope="module")
def throttled() -> Iterator[LiveInstance]:
    with LiveInstance(worker=False, env={"LEDGER_AGENT_RATE": "2/s"}) as instance:
        yield instance


def _exhaust(instance: LiveInstance) -> None:
    """Spend this second's allowance until the ledger answers 429."""
    with LedgerClient(instance.url, instance.token, retry=RetryPolicy(max_attempts=1)) as plain:
        for _ in range(5):
            try:
                plain.get("warm:up-1:v1")
            except NotFound:
                continue
            except Throttled:
                return
    raise AssertionError("the ledger never throttled")


def test_429_is_retried_with_the_same_operation_id_and_acts_once(throttled):
    events = []
    with LedgerClient(throttled.url, throttled.token, on_retry=events.append) as client:
        _exhaust(throttled)
        oid = operation_id(workflow="throttled", subject="invoice-50", action="refund", sequence=1)
        op = client.submit("refund", refund_params("invoice-50"), operation_id=oid)
    assert op.status == "succeeded"
    assert events and {(e.reason, e.operation_id) for e in events} == {("429", oid)}
    assert all(e.delay >= 0.5 for e in events)  # waited as Retry-After asked, not at once
    assert throttled.effect_counts().get(oid) == 1


def test_429_after_every_retry_raises_throttled_and_nothing_was_sent(throttled):
    policy = RetryPolicy(max_attempts=1)
    with LedgerClient(throttled.url, throttled.token, retry=policy) as client:
        _exhaust(throttled)
        oid = operation_id(workflow="throttled", subject="invoice-51", action="refund", sequence=1)
        with pytest.raises(Throttled) as caught:
            client.submit("refund", refund_params("invoice-51"), operation_id=oid)
    assert caught.value.status == 429 and caught.value.code == "throttled"
    assert oid not in throttled.effect_counts()
