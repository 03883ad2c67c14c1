"""When saturated, the service answers 503 + Retry-After (problem+json, code overloaded) in
bounded time instead of queueing every request."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from config.middleware import request_queue_age
from ledger.models import Operation
from tests.conftest import refund_params, submit_body

PROBLEM = "application/problem+json"


@pytest.mark.django_db(transaction=True)
def test_saturated_server_sheds_the_excess_with_503_and_retry_after(
    live_server, agent_and_token, sandbox, settings
):
    """A real threaded server: 2 slots, 6 concurrent submissions whose provider answers only
    after the 1 s request timeout. Two run; the other four are shed after the 0.2 s wait."""
    settings.LEDGER_MAX_CONCURRENT_REQUESTS = 2
    settings.LEDGER_MAX_QUEUE_WAIT_SECONDS = 0.2
    settings.LEDGER_OVERLOAD_RETRY_AFTER_SECONDS = 3
    token = agent_and_token[1]
    results: dict[int, httpx.Response] = {}
    elapsed: dict[int, float] = {}
    start = threading.Barrier(6)

    def submit(n: int) -> None:
        body = submit_body(f"wf-load:inv-{n}:refund-1:v1",
                           params=refund_params(invoice=f"inv-{n}", memo="sandbox:timeout"))
        start.wait()
        began = time.monotonic()
        results[n] = httpx.post(f"{live_server.url}/api/v1/operations", json=body,
                                headers={"Authorization": f"Bearer {token}"}, timeout=30)
        elapsed[n] = time.monotonic() - began

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    codes = sorted(response.status_code for response in results.values())
    assert codes == [202, 202, 503, 503, 503, 503], codes
    shed = [n for n, response in results.items() if response.status_code == 503]
    served = [n for n, response in results.items() if response.status_code == 202]
    for n in shed:
        response = results[n]
        assert response.headers["Content-Type"] == PROBLEM
        assert response.headers["Retry-After"] == "3"
        assert response.json()["code"] == "overloaded"
        # Shed in bounded time: they did not wait for the slow requests to finish.
        assert elapsed[n] < min(elapsed[m] for m in served)
    # Shed requests wrote nothing; the served ones were recorded.
    assert sorted(Operation.objects.values_list("operation_id", flat=True)) == sorted(
        f"wf-load:inv-{n}:refund-1:v1" for n in served)
    # Probes are never shed, even while saturated.
    assert httpx.get(f"{live_server.url}/healthz").status_code == 200


def test_a_request_that_waited_too_long_in_the_proxy_queue_is_shed(api, settings):
    settings.LEDGER_MAX_QUEUE_WAIT_SECONDS = 1.0
    stale = f"t={int((time.time() - 5) * 1_000_000)}"  # nginx-style microseconds, 5 s ago
    fresh = f"t={time.time():.3f}"

    shed = api.get("/api/v1/operations/a:b", HTTP_X_REQUEST_START=stale)
    served = api.get("/api/v1/operations/a:b", HTTP_X_REQUEST_START=fresh)

    assert shed.status_code == 503 and shed["Content-Type"] == PROBLEM
    assert shed.json()["code"] == "overloaded" and "Retry-After" in shed
    assert served.status_code == 404


@pytest.mark.parametrize(
    ("header", "age"),
    [("t=1000.5", 9.5), ("t=1000500", 9.5), ("t=1000500000", 9.5), ("1000", 10.0),
     ("nonsense", None), (None, None)],
)
def test_request_start_stamps_in_seconds_milli_or_microseconds(header, age):
    assert request_queue_age(header, now=1010.0) == age
