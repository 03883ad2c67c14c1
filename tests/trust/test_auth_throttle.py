"""Failed authentication is throttled per client address, with Retry-After."""

from __future__ import annotations

import os

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from ledger.models import Operation

PROBLEM = "application/problem+json"


@pytest.fixture(autouse=True)
def _clean_cache():
    cache.clear()
    yield
    cache.clear()


def client_from(address: str, token: str) -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_wrong_tokens_from_one_address_get_429_with_retry_after(db, settings, agent_and_token):
    settings.LEDGER_AUTH_FAILURE_RATE = "5/min"
    attacker = client_from("203.0.113.9", "al_deadbeef_wrong")

    codes = [attacker.get("/api/v1/operations/a:b").status_code for _ in range(8)]

    assert codes[:5] == [401] * 5
    assert codes[5:] == [429] * 3
    throttled = attacker.get("/api/v1/operations/a:b")
    assert throttled["Content-Type"] == PROBLEM
    assert 1 <= int(throttled["Retry-After"]) <= 60
    assert throttled.json()["code"] == "throttled"
    assert Operation.objects.count() == 0


def test_the_throttle_is_per_address_and_lifts_after_the_window(
    db, settings, agent_and_token, frozen
):
    settings.LEDGER_AUTH_FAILURE_RATE = "3/min"
    _, good_token = agent_and_token
    for _ in range(3):
        client_from("203.0.113.9", "al_deadbeef_wrong").get("/api/v1/operations/a:b")

    assert client_from("203.0.113.9", good_token).get("/api/v1/operations/a:b").status_code == 429
    assert client_from("198.51.100.7", good_token).get("/api/v1/operations/a:b").status_code == 404

    frozen.shift(61)
    assert client_from("203.0.113.9", good_token).get("/api/v1/operations/a:b").status_code == 404


def test_a_forged_forwarded_for_header_does_not_change_the_address(db, settings):
    settings.LEDGER_AUTH_FAILURE_RATE = "2/min"
    codes = [
        APIClient(REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR=f"10.0.0.{n}")
        .get("/api/v1/operations/a:b", HTTP_AUTHORIZATION="Bearer al_deadbeef_no")
        .status_code
        for n in range(4)
    ]
    assert codes == [401, 401, 429, 429]


def test_successful_requests_are_not_counted(api, settings):
    settings.LEDGER_AUTH_FAILURE_RATE = "2/min"
    assert all(api.get("/api/v1/operations/a:b").status_code == 404 for _ in range(5))


def test_the_throttle_is_shared_through_redis_when_cache_url_is_set(db, settings):
    """With CACHE_URL (Redis), every web process counts the same failures."""
    import redis

    url = os.environ.get("LEDGER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError:
        if os.environ.get("CI"):
            raise
        pytest.skip("no Redis")
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": url, "KEY_PREFIX": f"trust-{os.getpid()}"}}
    from django.core.cache import caches

    caches["default"].clear()
    settings.LEDGER_AUTH_FAILURE_RATE = "2/min"
    try:
        codes = [client_from("203.0.113.50", "al_deadbeef_x").get("/api/v1/operations/a:b")
                 .status_code for _ in range(3)]
        stored = caches["default"].get("ledger:authfail:203.0.113.50")
    finally:
        caches["default"].clear()
    assert codes == [401, 401, 429]
    assert stored is not None and len(stored) == 2  # the history lives in Redis
