"""The sandbox's Stripe-compatible refunds API, on the wire: form bodies, Stripe-shaped objects
and errors, and the shared idempotency, fault and effects machinery behind them."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sandbox.stripe_api import parse_form
from sandbox.testing import SandboxClient

API_KEY = "sk_test_sandbox"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
OP = "wf-1:invoice-17:refund-1:v1"

PostRefund = Callable[..., httpx.Response]


def refund_form(**overrides: Any) -> dict[str, Any]:
    form: dict[str, Any] = {
        "amount": "2500",
        "currency": "eur",
        "payment_intent": "pi_invoice-17",
        "metadata[operation_id]": OP,
        "metadata[invoice]": "invoice-17",
        "metadata[payee]": "cus_123",
    }
    form.update(overrides)
    return {name: value for name, value in form.items() if value is not None}


@pytest.fixture
def post_refund(http: httpx.Client) -> PostRefund:
    def post(form: dict[str, Any] | None = None, *, key: str | None = "key-1",
             headers: dict[str, str] | None = None, timeout: float | None = None
             ) -> httpx.Response:
        sent = dict(AUTH if headers is None else headers)
        if key is not None:
            sent["Idempotency-Key"] = key
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        return http.post("/v1/refunds", data=form if form is not None else refund_form(),
                         headers=sent, **extra)

    return post


def list_refunds(http: httpx.Client, **query: str) -> httpx.Response:
    return http.get("/v1/refunds", params=query, headers=AUTH)


def error_of(response: httpx.Response) -> dict[str, Any]:
    return dict(response.json()["error"])


# --- create ------------------------------------------------------------------------------------


def test_create_answers_200_with_a_stripe_refund_and_logs_one_effect(
    post_refund: PostRefund, sandbox: SandboxClient
) -> None:
    response = post_refund()

    assert response.status_code == 200
    assert response.headers["Request-Id"].startswith("req_")
    assert "Idempotent-Replayed" not in response.headers
    refund = response.json()
    assert refund["id"].startswith("re_") and refund["object"] == "refund"
    assert refund["status"] == "succeeded"
    assert (refund["amount"], refund["currency"]) == (2500, "eur")
    assert refund["payment_intent"] == "pi_invoice-17" and refund["charge"] is None
    assert refund["metadata"] == {"operation_id": OP, "invoice": "invoice-17", "payee": "cus_123"}
    assert isinstance(refund["created"], int)
    assert sandbox.effects() == [refund]
    assert sandbox.effect_counts() == {OP: 1}
    assert sandbox.request_counts()["by_reference"] == {OP: 1}


def test_refunds_and_generic_effects_do_not_see_each_other(
    post_refund: PostRefund, http: httpx.Client, sandbox: SandboxClient
) -> None:
    refund = post_refund().json()
    effect = http.post("/v1/effects/refund", json={"reference": OP, "params": {"amount": 1}},
                       headers={"Idempotency-Key": "generic-1"}).json()

    assert http.get("/v1/effects", params={"reference": OP}).json()["data"] == [effect]
    assert http.get(f"/v1/effects/{refund['id']}").status_code == 404
    assert http.get(f"/v1/refunds/{effect['id']}", headers=AUTH).status_code == 404
    assert list_refunds(http, payment_intent="pi_invoice-17").json()["data"] == [refund]
    # The effects log counts both: each is a real execution for the operation.
    assert sandbox.effect_counts() == {OP: 2}


def test_same_key_replays_the_stored_refund(post_refund: PostRefund,
                                            sandbox: SandboxClient) -> None:
    first = post_refund()

    replay = post_refund()

    assert replay.status_code == 200
    assert replay.json() == first.json()
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.headers["Original-Request"] == first.headers["Request-Id"]
    assert sandbox.effect_counts() == {OP: 1}


def test_same_key_with_other_params_is_stripes_400_idempotency_error(
    post_refund: PostRefund, sandbox: SandboxClient
) -> None:
    post_refund()

    response = post_refund(refund_form(amount="999"))

    assert response.status_code == 400
    assert error_of(response)["type"] == "idempotency_error"
    assert sandbox.effect_counts() == {OP: 1}


def test_key_retention_expires_on_the_sandbox_clock(post_refund: PostRefund,
                                                   sandbox: SandboxClient) -> None:
    post_refund()
    sandbox.advance_clock(24 * 3600)

    assert "Idempotent-Replayed" not in post_refund().headers
    assert sandbox.effect_counts() == {OP: 2}


# --- faults ------------------------------------------------------------------------------------


def test_reject_in_metadata_is_a_stored_402_card_decline(post_refund: PostRefund,
                                                         sandbox: SandboxClient) -> None:
    form = refund_form(**{"metadata[memo]": "sandbox:reject"})

    response = post_refund(form)

    assert response.status_code == 402
    assert error_of(response) == {"type": "card_error", "code": "card_declined",
                                  "message": "Your card was declined."}
    replay = post_refund(form)
    assert replay.status_code == 402 and replay.headers["Idempotent-Replayed"] == "true"
    assert sandbox.effect_counts() == {}


def test_a_fault_in_the_reason_applies_too(post_refund: PostRefund,
                                           sandbox: SandboxClient) -> None:
    assert post_refund(refund_form(reason="sandbox:reject")).status_code == 402
    assert sandbox.request_counts()["by_fault"] == {"reject": 1}


def test_a_fault_in_any_metadata_value_applies(post_refund: PostRefund,
                                               sandbox: SandboxClient) -> None:
    form = refund_form(**{"metadata[payee]": "sandbox:reject"})
    assert post_refund(form).status_code == 402


def test_500_after_commit_executes_and_the_500_is_replayed_like_stripe_v1(
    post_refund: PostRefund, sandbox: SandboxClient
) -> None:
    form = refund_form(**{"metadata[memo]": "sandbox:500-after-commit"})

    response = post_refund(form)

    assert response.status_code == 500 and error_of(response)["type"] == "api_error"
    assert sandbox.effect_counts() == {OP: 1}
    replay = post_refund(form)
    assert replay.status_code == 500 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == response.json()
    assert sandbox.effect_counts() == {OP: 1}


def test_lose_response_commits_then_hangs_up_and_the_key_replays_the_refund(
    post_refund: PostRefund, sandbox: SandboxClient
) -> None:
    form = refund_form(**{"metadata[memo]": "sandbox:lose-response"})
    with pytest.raises(httpx.RemoteProtocolError):
        post_refund(form)

    [refund] = sandbox.effects()
    replay = post_refund(form)
    assert replay.status_code == 200 and replay.json() == refund
    assert sandbox.effect_counts() == {OP: 1}


def test_drop_before_commit_executes_nothing_and_the_retry_executes_once(
    post_refund: PostRefund, sandbox: SandboxClient
) -> None:
    form = refund_form(**{"metadata[memo]": "sandbox:drop-before-commit"})
    with pytest.raises(httpx.RemoteProtocolError):
        post_refund(form)
    assert sandbox.effect_counts() == {}

    retry = post_refund(form)

    assert retry.status_code == 200 and "Idempotent-Replayed" not in retry.headers
    assert sandbox.effect_counts() == {OP: 1}


def test_timeout_keeps_the_key_in_progress_with_a_409(post_refund: PostRefund,
                                                      sandbox: SandboxClient) -> None:
    form = refund_form(**{"metadata[memo]": "sandbox:timeout"})
    with pytest.raises(httpx.ReadTimeout):
        post_refund(form, timeout=0.1)

    busy = post_refund(form)

    assert busy.status_code == 409 and error_of(busy)["type"] == "idempotency_error"
    assert sandbox.effect_counts() == {OP: 1}
    deadline = time.monotonic() + 5
    while (replay := post_refund(form)).status_code == 409:
        assert time.monotonic() < deadline, "key stayed in progress"
        time.sleep(0.1)
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"


def test_rate_limit_is_a_429_that_stores_nothing(post_refund: PostRefund,
                                                 sandbox: SandboxClient) -> None:
    form = refund_form(**{"metadata[memo]": "sandbox:rate-limit"})

    limited = post_refund(form)

    assert limited.status_code == 429
    assert error_of(limited)["code"] == "rate_limit"
    assert sandbox.effect_counts() == {}
    assert post_refund(form).status_code == 200
    assert sandbox.effect_counts() == {OP: 1}


def test_rate_limit_applies_to_the_generic_api_too(http: httpx.Client,
                                                   sandbox: SandboxClient) -> None:
    body = {"reference": OP, "params": {"memo": "sandbox:rate-limit"}}

    limited = http.post("/v1/effects/refund", json=body, headers={"Idempotency-Key": "k"})

    assert limited.status_code == 429 and limited.headers["Retry-After"] == "1"
    assert http.post("/v1/effects/refund", json=body,
                     headers={"Idempotency-Key": "k"}).status_code == 201
    assert sandbox.effect_counts() == {OP: 1}


# --- validation and authentication: refused before execution, nothing stored -------------------


@pytest.mark.parametrize(
    ("overrides", "param", "code"),
    [
        ({"amount": None}, "amount", "parameter_missing"),
        ({"amount": "12.50"}, "amount", "parameter_invalid_integer"),
        ({"amount": "0"}, "amount", "parameter_invalid_integer"),
        ({"currency": None}, "currency", "parameter_missing"),
        ({"currency": "euro"}, "currency", "parameter_invalid_string"),
        ({"payment_intent": "invoice-17"}, "payment_intent", "resource_missing"),
        ({"reason": "because"}, "reason", "parameter_invalid_string"),
        ({"reason": "sandbox:no-such-fault"}, "reason", "parameter_invalid_string"),
        ({"destination": "acct_1"}, "destination", "parameter_unknown"),
        ({"metadata[memo]": "m" * 501}, "metadata[memo]", None),
    ],
)
def test_invalid_params_are_a_400_and_do_not_use_up_the_key(
    post_refund: PostRefund, sandbox: SandboxClient, overrides: dict[str, Any], param: str,
    code: str | None,
) -> None:
    response = post_refund(refund_form(**overrides))

    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error.get("code") == code
    # Stripe saves nothing for a request that failed validation: the key is still fresh.
    assert post_refund().status_code == 200
    assert sandbox.effect_counts() == {OP: 1}


def test_exactly_one_of_payment_intent_or_charge(post_refund: PostRefund) -> None:
    neither = post_refund(refund_form(payment_intent=None), key="k-neither")
    both = post_refund(refund_form(charge="ch_1"), key="k-both")
    charge = post_refund(refund_form(payment_intent=None, charge="ch_1"), key="k-charge")

    assert neither.status_code == both.status_code == 400
    assert charge.status_code == 200 and charge.json()["charge"] == "ch_1"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer sk_live_real"}, {"Authorization": "Bearer"},
     {"Authorization": "Token sk_test_sandbox"}],
)
def test_create_needs_a_test_mode_key(post_refund: PostRefund, sandbox: SandboxClient,
                                      headers: dict[str, str]) -> None:
    response = post_refund(headers=headers)

    assert response.status_code == 401
    assert "sk_live_real" not in response.text
    assert sandbox.effect_counts() == {}


def test_basic_auth_with_the_key_as_user_name_is_accepted(post_refund: PostRefund) -> None:
    token = base64.b64encode(f"{API_KEY}:".encode()).decode()
    assert post_refund(headers={"Authorization": f"Basic {token}"}).status_code == 200


def test_reads_need_a_key_too(http: httpx.Client) -> None:
    assert http.get("/v1/refunds").status_code == 401
    assert http.get("/v1/refunds/re_1").status_code == 401


def test_form_parsing_nests_metadata_and_refuses_ambiguity() -> None:
    assert parse_form(b"amount=1&metadata%5Bk%5D=v&metadata[x]=y") == {
        "amount": "1", "metadata": {"k": "v", "x": "y"}}
    for body in (b"amount=1&amount=2", b"metadata[k]=1&metadata[k]=2", b"metadata=1&metadata[k]=2",
                 b"expand[]=x", b"\xff=1"):
        with pytest.raises(ValueError):
            parse_form(body)


# --- reads -------------------------------------------------------------------------------------


def test_retrieve_by_id_is_consistent_despite_index_lag(
    post_refund: PostRefund, http: httpx.Client, sandbox: SandboxClient
) -> None:
    sandbox.configure(index_lag_seconds=60)
    refund = post_refund().json()

    response = http.get(f"/v1/refunds/{refund['id']}", headers=AUTH)

    assert response.status_code == 200 and response.json() == refund
    missing = http.get("/v1/refunds/re_missing", headers=AUTH)
    assert missing.status_code == 404
    assert error_of(missing)["code"] == "resource_missing"


def test_list_by_payment_intent_is_newest_first_and_skips_other_payments(
    post_refund: PostRefund, http: httpx.Client
) -> None:
    older = post_refund(key="k-1").json()
    newer = post_refund(refund_form(amount="100"), key="k-2").json()
    post_refund(refund_form(payment_intent="pi_invoice-99"), key="k-3")

    page = list_refunds(http, payment_intent="pi_invoice-17").json()

    assert page == {"object": "list", "data": [newer, older], "has_more": False,
                    "url": "/v1/refunds"}


def test_list_pages_with_limit_and_starting_after(post_refund: PostRefund,
                                                  http: httpx.Client) -> None:
    ids = [post_refund(key=f"k-{n}").json()["id"] for n in range(3)]

    first = list_refunds(http, payment_intent="pi_invoice-17", limit="2").json()
    rest = list_refunds(http, payment_intent="pi_invoice-17", limit="2",
                        starting_after=first["data"][-1]["id"]).json()

    assert [r["id"] for r in first["data"]] == ids[:0:-1] and first["has_more"]
    assert [r["id"] for r in rest["data"]] == ids[:1] and not rest["has_more"]


def test_list_lags_behind_the_commit_like_every_other_lookup(
    post_refund: PostRefund, http: httpx.Client, sandbox: SandboxClient
) -> None:
    sandbox.configure(index_lag_seconds=30)
    refund = post_refund().json()

    assert list_refunds(http, payment_intent="pi_invoice-17").json()["data"] == []
    sandbox.advance_clock(30)
    assert list_refunds(http, payment_intent="pi_invoice-17").json()["data"] == [refund]


def test_lookup_lag_fault_delays_only_that_refund_in_the_list(
    post_refund: PostRefund, http: httpx.Client, sandbox: SandboxClient
) -> None:
    lagging = post_refund(refund_form(**{"metadata[memo]": "sandbox:lookup-lag-20"}),
                          key="k-1").json()
    prompt = post_refund(key="k-2").json()

    assert list_refunds(http, payment_intent="pi_invoice-17").json()["data"] == [prompt]
    sandbox.advance_clock(20)
    assert list_refunds(http, payment_intent="pi_invoice-17").json()["data"] == [prompt, lagging]


@pytest.mark.parametrize(
    ("query", "param"),
    [({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"customer": "cus_1"}, "customer"),
     ({"starting_after": "re_missing"}, "starting_after")],
)
def test_list_refuses_bad_queries(http: httpx.Client, query: dict[str, str], param: str) -> None:
    response = list_refunds(http, **query)

    assert response.status_code == 400
    assert error_of(response)["param"] == param
