"""Fault scenarios (magic values and chaos), lookup lag, and the pure helpers behind them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import store
from sandbox.config import DEFAULT_CHAOS_FAULTS, ConfigError, SandboxConfig
from sandbox.effects import find_magic_fault
from sandbox.testing import SandboxClient, SandboxServer

PostEffect = Callable[..., httpx.Response]


def lookup(http: httpx.Client, **query: str) -> list[dict[str, Any]]:
    response = http.get("/v1/effects", params=query)
    assert response.status_code == 200
    return list(response.json()["data"])


def post_until_settled(post_effect: PostEffect, *args: Any, **kwargs: Any) -> httpx.Response:
    """Repeat a same-key request while the provider still answers 409 (as a caller would)."""
    deadline = time.monotonic() + 5
    while (response := post_effect(*args, **kwargs)).status_code == 409:
        assert time.monotonic() < deadline, "key stayed in progress"
        time.sleep(float(response.headers["Retry-After"]) / 10)
    return response


# --- magic-value scenarios ---------------------------------------------------------------------


def test_lose_response_commits_then_hangs_up(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    params = {"amount": 5, "memo": "sandbox:lose-response"}
    with pytest.raises(httpx.RemoteProtocolError):
        post_effect("op-1", params, key="k-1")

    [effect] = sandbox.effects()
    assert effect["reference"] == "op-1"
    replay = post_effect("op-1", params, key="k-1")
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == effect
    assert sandbox.effect_counts() == {"op-1": 1}


def test_timeout_commits_then_answers_too_late(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    params = {"amount": 5, "memo": "sandbox:timeout"}
    with pytest.raises(httpx.ReadTimeout):
        post_effect("op-1", params, key="k-1", timeout=0.1)

    [effect] = sandbox.effects()
    # The provider is still "working" on the original: repeats are told to wait, not executed.
    assert post_effect("op-1", params, key="k-1").status_code == 409
    replay = post_until_settled(post_effect, "op-1", params, key="k-1")
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == effect
    assert sandbox.effect_counts() == {"op-1": 1}


def test_timeout_answers_normally_if_the_caller_waits(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    sandbox.configure(timeout_sleep_seconds=0.2)
    started = time.monotonic()
    response = post_effect("op-1", {"memo": "sandbox:timeout"}, key="k-1")
    assert time.monotonic() - started >= 0.2
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response.headers


def test_500_after_commit_still_executed_and_replays_the_success(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    params = {"amount": 5, "memo": "sandbox:500-after-commit"}
    first = post_effect("op-1", params, key="k-1")

    assert first.status_code == 500
    assert first.json()["error"]["type"] == "api_error"
    [effect] = sandbox.effects()
    replay = post_effect("op-1", params, key="k-1")
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == effect
    assert sandbox.effect_counts() == {"op-1": 1}


def test_drop_before_commit_executes_nothing_and_a_repeat_executes_once(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    params = {"amount": 5, "memo": "sandbox:drop-before-commit"}
    with pytest.raises(httpx.RemoteProtocolError):
        post_effect("op-1", params, key="k-1")
    assert sandbox.effects() == []

    retry = post_effect("op-1", params, key="k-1")
    assert retry.status_code == 201
    assert "Idempotent-Replayed" not in retry.headers
    again = post_effect("op-1", params, key="k-1")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert sandbox.effect_counts() == {"op-1": 1}


def test_reject_is_stored_and_replayed(post_effect: PostEffect, sandbox: SandboxClient) -> None:
    params = {"amount": 5, "memo": "sandbox:reject"}
    first = post_effect("op-1", params, key="k-1")

    assert first.status_code == 402
    assert first.json() == {
        "error": {
            "type": "card_error",
            "code": "sandbox_rejected",
            "message": "rejected by the sandbox",
        }
    }
    replay = post_effect("op-1", params, key="k-1")
    assert replay.status_code == 402
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert sandbox.effects() == []


def test_without_a_key_the_scenario_applies_to_every_request(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    assert post_effect("op-1", {"x": "sandbox:reject"}).status_code == 402
    assert post_effect("op-1", {"x": "sandbox:reject"}).status_code == 402
    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError):
            post_effect("op-2", {"x": "sandbox:lose-response"})

    assert sandbox.effect_counts() == {"op-2": 2}
    assert sandbox.request_counts()["by_fault"] == {"lose-response": 2, "reject": 2}


def test_after_expiry_a_key_is_new_and_its_scenario_fires_again(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    sandbox.configure(key_retention_seconds=60)
    assert post_effect("op-1", {"x": "sandbox:reject"}, key="k-1").status_code == 402
    sandbox.advance_clock(61)
    response = post_effect("op-1", {"x": "sandbox:reject"}, key="k-1")
    assert response.status_code == 402
    assert "Idempotent-Replayed" not in response.headers


# --- lookup lag --------------------------------------------------------------------------------


def test_lookup_lag_hides_the_effect_from_key_and_reference_lookups(
    http: httpx.Client, post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    effect = post_effect("op-1", {"memo": "sandbox:lookup-lag-30"}, key="k-1").json()

    assert lookup(http, idempotency_key="k-1") == []
    assert lookup(http, reference="op-1") == []
    assert http.get(f"/v1/effects/{effect['id']}").json() == effect  # by id: consistent read
    assert sandbox.effects() == [effect]  # the effects log ignores lag

    sandbox.advance_clock(29)
    assert lookup(http, reference="op-1") == []
    sandbox.advance_clock(1)
    assert lookup(http, idempotency_key="k-1") == [effect]
    assert lookup(http, reference="op-1") == [effect]


def test_global_index_lag_adds_to_every_effect(
    http: httpx.Client, post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    sandbox.configure(index_lag_seconds=10)
    plain = post_effect("op-1", key="k-1").json()
    lagged = post_effect("op-2", {"memo": "sandbox:lookup-lag-5"}, key="k-2").json()

    assert lookup(http, reference="op-1") == []
    sandbox.advance_clock(10)
    assert lookup(http, reference="op-1") == [plain]
    assert lookup(http, reference="op-2") == []
    sandbox.advance_clock(5)
    assert lookup(http, idempotency_key="k-2") == [lagged]


# --- chaos -------------------------------------------------------------------------------------


def classify(http: httpx.Client, post_effect: PostEffect, index: int) -> str:
    """What a caller plus the effects log can observe about one chaos request."""
    reference = f"chaos-{index}"
    try:
        # Well apart from the sandbox's 2 s timeout fault, so a slow answer on a loaded machine
        # is never mistaken for it.
        response = post_effect(reference, {"n": index}, key=f"key-{index}", timeout=1.0)
    except httpx.ReadTimeout:
        return "timeout"
    except httpx.RemoteProtocolError:
        executed = http.get("/_sandbox/effects", params={"reference": reference}).json()["data"]
        return "lose-response" if executed else "drop-before-commit"
    if response.status_code == 500:
        return "500-after-commit"
    if response.status_code == 402:
        return "reject"
    assert response.status_code == 201
    return "lookup-lag-2" if not lookup(http, reference=reference) else "none"


def chaos_run(
    http: httpx.Client, post_effect: PostEffect, sandbox: SandboxClient
) -> tuple[list[str], dict[str, int]]:
    sandbox.reset()
    sandbox.configure(chaos_probability=0.7, chaos_seed=42, timeout_sleep_seconds=2.0)
    outcomes = [classify(http, post_effect, index) for index in range(30)]
    return outcomes, sandbox.request_counts()["by_fault"]


def test_chaos_is_deterministic_per_seed_and_produces_every_fault(
    http: httpx.Client, post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    first, first_faults = chaos_run(http, post_effect, sandbox)
    second, second_faults = chaos_run(http, post_effect, sandbox)

    assert first == second
    assert first_faults == second_faults
    assert set(first) == {*DEFAULT_CHAOS_FAULTS, "none"}
    # What the caller observed agrees with what the sandbox says it injected.
    observed = Counter(outcome for outcome in first if outcome != "none")
    assert observed == Counter(first_faults)


def test_chaos_spares_repeats_and_magic_values(
    post_effect: PostEffect, sandbox: SandboxClient
) -> None:
    sandbox.configure(chaos_probability=1, chaos_faults=["reject"])
    assert post_effect("op-1", key="k-1").status_code == 402
    assert post_effect("op-1", key="k-1").headers["Idempotent-Replayed"] == "true"

    sandbox.configure(chaos_faults="drop-before-commit")
    with pytest.raises(httpx.RemoteProtocolError):
        post_effect("op-2", key="k-2")
    assert post_effect("op-2", key="k-2").status_code == 201  # the repeat is not a first request

    # A magic value wins over chaos.
    assert post_effect("op-3", {"x": "sandbox:reject"}, key="k-3").status_code == 402
    assert sandbox.request_counts()["by_fault"] == {"drop-before-commit": 1, "reject": 2}


def test_chaos_from_the_environment() -> None:
    env = {"SANDBOX_CHAOS_PROBABILITY": "1", "SANDBOX_CHAOS_FAULTS": "reject"}
    with SandboxServer(env=env) as server, server.client() as client:
        assert client.config()["chaos_faults"] == ["reject"]
        response = httpx.post(
            f"{server.url}/v1/effects/email", json={"reference": "op-1", "params": {}}
        )
        assert response.status_code == 402
        assert client.effects() == []
        assert "POST /v1/effects/email 402" in server.log()


def test_bad_environment_fails_startup() -> None:
    with pytest.raises(RuntimeError, match="chaos_probability"):
        SandboxServer(env={"SANDBOX_CHAOS_PROBABILITY": "lots"}).start()


# --- pure helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "fault"),
    [
        ({"amount": 5}, None),
        ({"memo": "sandbox:reject"}, "reject"),
        ({"a": {"b": [1, {"c": "sandbox:timeout"}]}}, "timeout"),
        ({"lines": ["x", "sandbox:lookup-lag-7"]}, "lookup-lag-7"),
        ({"memo": "sandbox:reject "}, None),
        ({"memo": "please sandbox:reject"}, None),
        ({"memo": "sandbox:lookup-lag-x"}, None),
        ({"sandbox:reject": "key names do not count"}, None),
        ({"first": "sandbox:reject", "second": "sandbox:timeout"}, "reject"),
    ],
)
def test_find_magic_fault(params: dict[str, Any], fault: str | None) -> None:
    assert find_magic_fault(params) == fault


def test_config_from_env() -> None:
    config = SandboxConfig.from_env(
        {
            "SANDBOX_CHAOS_PROBABILITY": "0.5",
            "SANDBOX_CHAOS_SEED": "9",
            "SANDBOX_CHAOS_FAULTS": "reject, sandbox:lookup-lag-3",
            "SANDBOX_KEY_RETENTION_SECONDS": "60",
        }
    )
    assert config.chaos_probability == 0.5
    assert config.chaos_seed == 9
    assert config.chaos_faults == ("reject", "lookup-lag-3")
    assert config.key_retention_seconds == 60
    assert SandboxConfig.from_env({}) == SandboxConfig()
    with pytest.raises(ConfigError):
        SandboxConfig.from_env({"SANDBOX_INDEX_LAG_SECONDS": "-1"})


def test_restart_settles_keys_left_in_progress(tmp_path: Path) -> None:
    """A sandbox killed mid-`timeout` keeps the committed effect; its key replays afterwards."""
    storage = store.Store(tmp_path / "sandbox.sqlite3")
    storage.initialise()
    with storage.connect() as conn:
        committed = store.claim_key(conn, "k-1", "fp", 0.0, 60.0)
        response = store.StoredResponse(201, b"{}", "req_1")
        store.commit_outcome(
            conn, key="k-1", token=committed.token, effect=None, response=response, settled=False
        )
        store.claim_key(conn, "k-2", "fp", 0.0, 60.0)  # crashed before committing anything
        assert store.claim_key(conn, "k-1", "fp", 1.0, 60.0).state is store.ClaimState.IN_PROGRESS

    storage.initialise()  # what a restarted process does

    with storage.connect() as conn:
        replay = store.claim_key(conn, "k-1", "fp", 1.0, 60.0)
        assert replay.state is store.ClaimState.REPLAY
        assert replay.response == response
        assert store.claim_key(conn, "k-2", "fp", 1.0, 60.0).state is store.ClaimState.RETRY
