from __future__ import annotations

import re
from decimal import Decimal

import pytest

from ledger.canonical import (
    CanonicalizationError,
    canonical_json,
    params_hash,
    provider_idempotency_key,
)
from ledger.identity import InvalidOperationId, build_operation_id, validate_operation_id
from ledger.tools import get_tool
from tests.conftest import refund_params


def test_canonical_json_sorts_keys_and_drops_whitespace():
    assert canonical_json({"b": 1, "a": [True, None, "x"]}) == '{"a":[true,null,"x"],"b":1}'


def test_key_order_does_not_change_the_hash():
    first = params_hash("refund", {"amount": 100, "currency": "EUR", "payee": "p", "invoice": "i"})
    second = params_hash("refund", {"invoice": "i", "payee": "p", "currency": "EUR", "amount": 100})
    assert first == second
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 64


def test_unicode_forms_hash_the_same_after_nfc():
    composed, decomposed = "Zoë Müller", "Zoe\u0308 Mu\u0308ller"
    assert composed != decomposed
    assert params_hash("refund", {"payee": composed}) == params_hash(
        "refund", {"payee": decomposed}
    )


@pytest.mark.parametrize("bad", [12.5, Decimal("12.50"), float("nan"), float("inf")])
def test_floats_decimals_nan_and_infinity_are_refused(bad):
    with pytest.raises(CanonicalizationError):
        params_hash("refund", {"amount": bad})


def test_tool_name_is_part_of_the_hash():
    assert params_hash("refund", {"a": 1}) != params_hash("send_email", {"a": 1})


def test_changing_a_non_intent_field_keeps_the_hash():
    tool = get_tool("refund")
    first = params_hash(tool.name, tool.intent(refund_params(memo="Sorry about that")))
    second = params_hash(tool.name, tool.intent(refund_params(memo="We apologise!")))
    assert first == second


def test_changing_an_intent_field_changes_the_hash():
    tool = get_tool("refund")
    assert params_hash(tool.name, tool.intent(refund_params(amount=2500))) != params_hash(
        tool.name, tool.intent(refund_params(amount=2501))
    )


def test_email_body_is_not_an_intent_field():
    tool = get_tool("send_email")
    base = {"to": "a@example.com", "template": "refund_sent", "subject": "Your refund"}
    assert tool.intent(base | {"body": "Hello"}) == tool.intent(base | {"body": "Hi there"})


def test_provider_key_is_deterministic_and_changes_with_the_version():
    digest = params_hash("refund", {"amount": 1})
    key = provider_idempotency_key(operation_id="wf:inv:refund-1:v1", params_hash=digest)
    assert key == provider_idempotency_key(operation_id="wf:inv:refund-1:v1", params_hash=digest)
    assert key != provider_idempotency_key(operation_id="wf:inv:refund-1:v2", params_hash=digest)


@pytest.mark.parametrize(
    "value",
    ["workflow-81:invoice-17:refund-2:v1", "a:b", "A.b~c_d-e:1", "x:" + "y" * 198],
)
def test_valid_operation_ids(value):
    assert validate_operation_id(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "single-segment",
        "a::b",
        ":a",
        "a:",
        "a b:c",
        "a:b/c",
        "ä:b",
        "a:b\n",
        "x:" + "y" * 199,
        None,
        17,
    ],
)
def test_invalid_operation_ids(value):
    with pytest.raises(InvalidOperationId):
        validate_operation_id(value)


def test_builder_makes_the_documented_shape():
    built = build_operation_id(workflow="workflow-81", subject="invoice-17", action="refund",
                               sequence=2, version=1)
    assert built == "workflow-81:invoice-17:refund-2:v1"
    with pytest.raises(InvalidOperationId):
        build_operation_id(workflow="w", subject="s", action="a", sequence=0)


@pytest.mark.parametrize("value, expected", [
    ({"amount": 2500, "currency": "EUR", "payee": "cus_123", "flag": True, "none": None},
     '{"amount":2500,"currency":"EUR","flag":true,"none":null,"payee":"cus_123"}'),
    # tuple, nested, non-ASCII value
    ({"b": [1, "x", {"c": "Zoë"}], "a": ("t", 2)}, '{"a":["t",2],"b":[1,"x",{"c":"Zoë"}]}'),
    ({"Zoe\u0308": 1}, '{"Zoë":1}'),  # a non-ASCII key: NFC decides
    ({"nested": {"deep": [{"k": True}, False]}}, '{"nested":{"deep":[{"k":true},false]}}'),
])
def test_canonical_json_of_plain_values(value, expected):
    assert canonical_json(value) == expected


@pytest.mark.parametrize("value, message", [
    ({"e\u0301": 1, "\u00e9": 2}, "$: duplicate key 'é' after NFC"),  # two keys NFC merges
    ({"x": 1.5}, "$.x: float is not allowed; use integers (minor units) or strings"),
    ({"list": [1, {"f": 2.5}]},
     "$.list[1].f: float is not allowed; use integers (minor units) or strings"),
    ({1: "x"}, "$: object keys must be strings"),
])
def test_canonical_json_refusals_name_the_path(value, message):
    with pytest.raises(CanonicalizationError, match=re.escape(message)):
        canonical_json(value)
