"""Idempotency-Key semantics, lookups, input validation and the control API, over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from sandbox.testing import SandboxClient, SandboxServer

PostEffect = Callable[..., httpx.Response]


def wait_for_effects(sandbox: SandboxClient, reference: str, count: int = 1) -> None:
    deadline = time.monotonic() + 3
    while len(sandbox.effects(reference)) < count:
        assert time.monotonic() < deadline, f"{reference} never reached {count} effects"
        time.sleep(0.02)


def test_first_request_executes_and_returns_the_effect(
    post_effect: PostEffect, sandbox: SandboxClient, http: httpx.Client
) -> None:
    before = sandbox.now()
    response = post_effect("op-1", {"amount": 1200, "currency": "EUR"}, key="k-1")

    assert response.status_code == 201
    assert response.headers["Request-Id"].startswith("req_")
    assert "Idempotent-Replayed" not in response.headers
    effect = response.json()
    assert effect["id"].startswith("eff_")
    assert effect | {"id": None, "created": None} == {
        "id": None,
        "object": "refund",
        "status": "succeeded",
        "reference": "op-1",
        "params": {"amount": 1200, "currency": "EUR"},
        "created": None,
        "idempotency_key": "k-1",
    }
    assert before <= effect["created"] <= sandbox.now()
    assert sandbox.effects() == [effect]
    assert http.get(f"/v1/effects/{effect['id']}").json() == effect


@pytest.mark.parametrize("kind", ["refund", "email", "ticket"])
def test_every_kind_is_accepted(post_effect: PostEffect, kind: str) -> None:
    response = post_effect("op-1", kind=kind)
    assert response.status_code == 201
    assert response.json()["object"] == kind


def test_same_key_replays_the_stored_response_byte_for_byte(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    first = post_effect("op-1", {"amount": 5}, key="k-1")
    again = post_effect("op-1", {"amount": 5}, key="k-1")

    assert again.status_code == 201
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Original-Request"] == first.headers["Request-Id"]
    assert again.headers["Request-Id"] != first.headers["Request-Id"]
    assert sandbox.effect_counts() == {"op-1": 1}


def test_fingerprint_ignores_json_key_order(http: httpx.Client, sandbox: SandboxClient) -> None:
    headers = {"Idempotency-Key": "k-1", "Content-Type": "application/json"}
    http.post(
        "/v1/effects/refund",
        content=b'{"reference":"op-1","params":{"a":1,"b":2}}',
        headers=headers,
    )
    again = http.post(
        "/v1/effects/refund",
        content=b'{"params":{"b":2,"a":1},"reference":"op-1"}',
        headers=headers,
    )
    assert again.headers["Idempotent-Replayed"] == "true"
    assert sandbox.effect_counts() == {"op-1": 1}


def test_ietf_quoted_key_is_the_same_key_as_the_bare_token(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    post_effect("op-1", key="k-1")
    again = post_effect("op-1", key='"k-1"')
    assert again.headers["Idempotent-Replayed"] == "true"
    assert sandbox.effect_counts() == {"op-1": 1}


@pytest.mark.parametrize(
    ("reference", "params", "kind"),
    [
        ("op-1", {"amount": 6}, "refund"),
        ("op-2", {"amount": 5}, "refund"),
        ("op-1", {"amount": 5}, "email"),
    ],
    ids=["params", "reference", "kind"],
)
def test_same_key_with_a_different_request_is_422_and_executes_nothing(
    post_effect: PostEffect, sandbox: SandboxClient, reference: str, params: dict, kind: str
) -> None:
    post_effect("op-1", {"amount": 5}, key="k-1")
    response = post_effect(reference, params, key="k-1", kind=kind)

    assert response.status_code == 422
    assert response.json()["error"]["type"] == "idempotency_error"
    assert response.json()["error"]["code"] == "idempotency_key_mismatch"
    assert sandbox.effect_counts() == {"op-1": 1}


def test_same_key_while_the_first_is_in_progress_is_409(
    post_effect: PostEffect, sandbox: SandboxClient, sandbox_server: SandboxServer
) -> None:
    params = {"amount": 5, "note": "sandbox:timeout"}
    results: list[httpx.Response] = []

    def slow_first_request() -> None:
        with httpx.Client(base_url=sandbox_server.url, timeout=5) as client:
            body = {"reference": "op-1", "params": params}
            results.append(
                client.post("/v1/effects/refund", json=body, headers={"Idempotency-Key": "k-1"})
            )

    first = threading.Thread(target=slow_first_request)
    first.start()
    wait_for_effects(sandbox, "op-1")

    busy = post_effect("op-1", params, key="k-1")
    first.join()

    assert busy.status_code == 409
    assert busy.headers["Retry-After"] == "1"
    assert busy.json()["error"]["type"] == "idempotency_error"
    assert busy.json()["error"]["code"] == "request_in_progress"
    assert results[0].status_code == 201
    replay = post_effect("op-1", params, key="k-1")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == results[0].content
    assert sandbox.effect_counts() == {"op-1": 1}


def test_key_expires_after_retention_and_then_executes_again(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    sandbox.configure(key_retention_seconds=60)
    first = post_effect("op-1", key="k-1")

    sandbox.advance_clock(59)
    assert post_effect("op-1", key="k-1").headers["Idempotent-Replayed"] == "true"

    sandbox.advance_clock(2)
    late = post_effect("op-1", key="k-1")
    assert late.status_code == 201
    assert "Idempotent-Replayed" not in late.headers
    assert late.json()["id"] != first.json()["id"]
    assert sandbox.effect_counts() == {"op-1": 2}
    # The new execution starts a new retention period.
    assert post_effect("op-1", key="k-1").content == late.content


def test_requests_without_a_key_are_not_deduplicated(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    first = post_effect("op-1")
    second = post_effect("op-1")

    assert first.status_code == second.status_code == 201
    assert first.json()["idempotency_key"] is None
    assert first.json()["id"] != second.json()["id"]
    assert sandbox.effect_counts() == {"op-1": 2}


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[]",
        b'"a string"',
        b'{"params": {}}',
        b'{"reference": "", "params": {}}',
        b'{"reference": 7, "params": {}}',
        b'{"reference": "op-1"}',
        b'{"reference": "op-1", "params": []}',
        b'{"reference": "op-1", "params": {"amount": NaN}}',
        b'{"reference": "op-1", "params": {"x": "\xff"}}',
    ],
)
def test_bad_input_is_400_and_writes_nothing(
    http: httpx.Client, post_effect: PostEffect, sandbox: SandboxClient, body: bytes
) -> None:
    headers = {"Idempotency-Key": "k-1", "Content-Type": "application/json"}
    response = http.post("/v1/effects/refund", content=body, headers=headers)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert sandbox.effects() == []
    # A rejected body does not burn the key: the next valid request executes normally.
    retry = post_effect("op-1", key="k-1")
    assert retry.status_code == 201
    assert "Idempotent-Replayed" not in retry.headers


@pytest.mark.parametrize("key", ["", '""', "x" * 256])
def test_bad_idempotency_key_is_400(
    post_effect: PostEffect, sandbox: SandboxClient, key: str
) -> None:
    response = post_effect("op-1", key=key)
    assert response.status_code == 400
    assert sandbox.effects() == []


def test_oversized_body_is_413(http: httpx.Client, sandbox: SandboxClient) -> None:
    body = json.dumps({"reference": "op-1", "params": {"blob": "x" * (1 << 20)}})
    response = http.post("/v1/effects/refund", content=body)
    assert response.status_code == 413
    assert sandbox.effects() == []


def test_unknown_kind_is_404(post_effect: PostEffect, sandbox: SandboxClient) -> None:
    response = post_effect("op-1", kind="wire-transfer")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert sandbox.effects() == []


def test_lookups_by_key_reference_and_id(http: httpx.Client, post_effect: PostEffect) -> None:
    one = post_effect("op-1", key="k-1").json()
    two = post_effect("op-1", {"amount": 2}).json()
    post_effect("op-2", key="k-2")

    by_key = http.get("/v1/effects", params={"idempotency_key": "k-1"}).json()
    assert by_key == {"object": "list", "data": [one]}
    assert http.get("/v1/effects", params={"reference": "op-1"}).json()["data"] == [one, two]
    assert http.get("/v1/effects", params={"reference": "nope"}).json()["data"] == []
    assert http.get(f"/v1/effects/{two['id']}").json() == two

    missing = http.get("/v1/effects/eff_unknown")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "resource_missing"
    assert http.get("/v1/effects").status_code == 400


def test_request_counts_cover_every_post_but_not_lookups(
    http: httpx.Client, post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    assert sandbox.request_counts() == {"total": 0, "by_reference": {}, "by_fault": {}}

    post_effect("op-1", key="k-1")
    post_effect("op-1", key="k-1")  # replay: still a request the provider received
    post_effect("op-2", {"x": "sandbox:reject"})
    http.post("/v1/effects/refund", content=b"{broken")
    http.get("/v1/effects", params={"reference": "op-1"})

    assert sandbox.request_counts() == {
        "total": 4,
        "by_reference": {"op-1": 2, "op-2": 1},
        "by_fault": {"reject": 1},
    }


def test_clock_control(sandbox: SandboxClient, http: httpx.Client) -> None:
    start = sandbox.now()
    assert sandbox.advance_clock(3600) >= start + 3600
    assert http.get("/_sandbox/clock").json()["offset"] == 3600
    assert sandbox.set_clock_offset(10) < start + 3600
    assert http.post("/_sandbox/clock", json={"advance": "soon"}).status_code == 400
    assert http.post("/_sandbox/clock", json={"advance": 1, "offset": 1}).status_code == 400


def test_config_control_and_reset(sandbox: SandboxClient, http: httpx.Client) -> None:
    config = sandbox.configure(chaos_probability=0.25, chaos_faults="reject,lookup-lag-3")
    assert config["chaos_probability"] == 0.25
    assert config["chaos_faults"] == ["reject", "lookup-lag-3"]
    assert sandbox.config() == config

    for bad in (
        {"chaos_probability": 2},
        {"chaos_faults": ["explode"]},
        {"key_retention_seconds": 0},
        {"chaos_seed": 1.5},
        {"surprise": 1},
    ):
        assert http.post("/_sandbox/config", json=bad).status_code == 400, bad

    sandbox.advance_clock(100)
    sandbox.reset()
    assert sandbox.config()["chaos_probability"] == 0
    assert sandbox.config()["timeout_sleep_seconds"] == 5
    assert http.get("/_sandbox/clock").json()["offset"] == 0


def test_health_and_unknown_routes(http: httpx.Client) -> None:
    # Started without --smtp-port: no SMTP listener.
    assert http.get("/_sandbox/health").json() == {"ok": True, "smtp_port": None}
    assert http.get("/nowhere").status_code == 404
    assert http.delete("/_sandbox/effects").status_code == 405


def test_concurrent_same_key_requests_execute_exactly_once(
    sandbox: SandboxClient, sandbox_server: SandboxServer
) -> None:
    body = {"reference": "op-1", "params": {"amount": 5}}
    barrier = threading.Barrier(16)
    statuses: list[int] = []

    def send() -> None:
        with httpx.Client(base_url=sandbox_server.url, timeout=5) as client:
            barrier.wait()
            response = client.post(
                "/v1/effects/refund", json=body, headers={"Idempotency-Key": "k-1"}
            )
            statuses.append(response.status_code)

    threads = [threading.Thread(target=send) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert set(statuses) <= {201, 409}
    assert 201 in statuses
    assert sandbox.effect_counts() == {"op-1": 1}
    assert sandbox.request_counts()["total"] == 16
