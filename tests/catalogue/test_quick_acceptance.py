"""catalogue.quick_acceptance: the shortcut that accepts plainly valid params without the full
JSON Schema validator never accepts params the full validator refuses, is used for the
catalogues' own tools, and stands aside for schemas outside its subset."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ledger.catalogue import LedgerValidator, _has_float, quick_acceptance
from ledger.tools import get_tool

ROOT = Path(__file__).resolve().parents[2]
CATALOGUES = [ROOT / "config" / "tools.toml", ROOT / "config" / "tools-stripe-smtp.toml",
              *sorted((ROOT / "tests" / "catalogues").glob("*.toml"))]

# Within the subset, with every keyword it handles.
SYNTHETIC = {
    "type": "object", "additionalProperties": False, "required": ["code", "n"],
    "description": "annotations never refuse anything",
    "properties": {
        "code": {"type": "string", "pattern": "^[a-z]{2,4}$", "title": "a code"},
        "word": {"type": "string", "minLength": 2, "maxLength": 5},
        "kind": {"type": "string", "enum": ["a", "b"]},
        "n": {"type": "integer", "minimum": -3, "maximum": 7},
        "m": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
        "flag": {"type": "boolean", "default": False},
    },
}


def schemas() -> list[tuple[str, dict[str, Any]]]:
    found = [("synthetic", SYNTHETIC)]
    for path in CATALOGUES:
        for entry in tomllib.loads(path.read_text(encoding="utf-8"))["tools"]:
            found.append((f"{path.name}:{entry['name']}:v{entry.get('version', 1)}",
                          entry["params"]))
    return found


TRICKY_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 7, 8, 10, 25, 100, 1_000_000_000, 1_000_000_001, -(2**63),
    2**70, 1.0, 2500.0, 0.5, float("nan"), "", "a", "ab", "abcd", "abcde", "abcdef", "EUR",
    "eur", "EURO", "EUR\n", "inv-1", "inv-1\n", "inv 1", "inv-\u200b1", "x" * 200, "x" * 201,
    "x" * 1000, "x" * 1001, "ü" * 5, "cus_1", "a@example.com", "not an address", [], ["a"],
    {}, {"a": 1}, "general", "refunds", "billing", "welcome", "receipt", "t" * 20001,
    "sup_1", "sup_abc", "sup_", "sup_1\n", "acc_1", "acc_x\n", "JPY", "jpy",
]


def full_accepts(schema: dict[str, Any], params: dict[str, Any]) -> bool:
    return (next(iter(LedgerValidator(schema).iter_errors(params)), None) is None
            and not any(_has_float(v) for v in params.values()))


BY_TYPE = {"string": [v for v in TRICKY_VALUES if type(v) is str],
           "integer": [v for v in TRICKY_VALUES if type(v) is int],
           "boolean": [True, False]}


def candidates(schema: dict[str, Any], rng: random.Random, count: int
               ) -> list[dict[str, Any]]:
    """Params of every sort: mostly values of the declared type (so that many are valid),
    often anything at all, sometimes a field too many or one missing."""
    out = []
    for _ in range(count):
        params = {}
        for name, spec in schema["properties"].items():
            if rng.random() < 0.9:
                typed = BY_TYPE.get(spec.get("type")) if isinstance(spec.get("type"), str) \
                    else None
                pool = typed if typed and rng.random() < 0.9 else TRICKY_VALUES
                params[name] = rng.choice(pool)
        if rng.random() < 0.05:
            params["surprise"] = rng.choice(TRICKY_VALUES)
        out.append({k: v for k, v in params.items() if v is not None})
    return out


@pytest.mark.parametrize(("label", "schema"), schemas(), ids=[s[0] for s in schemas()])
def test_it_never_accepts_params_the_full_validator_refuses(label, schema):
    quick = quick_acceptance(schema)
    if quick is None:
        pytest.skip(f"{label} is outside the subset: the full validator takes every call")
    rng = random.Random(label)
    accepted = 0
    for params in candidates(schema, rng, 6000):
        if quick(params):
            accepted += 1
            assert full_accepts(schema, params), (label, params)
    assert accepted > 0, f"{label}: no candidate was valid, so nothing was checked"


@pytest.mark.parametrize(("label", "schema"), schemas(), ids=[s[0] for s in schemas()])
def test_what_it_accepts_it_accepts_exactly_when_the_full_validator_does_for_plain_values(
        label, schema):
    """For values of the declared types, the two agree both ways (so the shortcut is taken
    for every valid submission, not only some)."""
    quick = quick_acceptance(schema)
    if quick is None:
        pytest.skip("outside the subset")
    rng = random.Random(f"{label}/typed")
    for _ in range(3000):
        params = {name: rng.choice(BY_TYPE[spec["type"]])
                  for name, spec in schema["properties"].items() if rng.random() < 0.85}
        assert quick(params) == full_accepts(schema, params), (label, params)


def test_the_demo_tools_take_the_shortcut_and_its_answer_is_the_full_one():
    refund = get_tool("refund")
    assert refund._quick is not None
    good = {"invoice": "inv-1", "amount": 2500, "currency": "EUR", "payee": "cus_1"}
    assert refund._quick(good) and refund._validate(good) == {}
    # Refused params still get the full validator's field errors.
    assert refund._validate({**good, "amount": 2500.0}) == {
        "amount": "must be an integer in minor units; decimals and floats are not accepted"}
    assert set(refund._validate({**good, "currency": "eur", "x": 1})) == {"currency", "x"}


@pytest.mark.parametrize("schema", [
    {**SYNTHETIC, "properties": {**SYNTHETIC["properties"], "n": {"type": "number"}}},
    {**SYNTHETIC, "properties": {**SYNTHETIC["properties"],
                                 "email": {"type": "string", "format": "email"}}},
    {**SYNTHETIC, "properties": {**SYNTHETIC["properties"], "n": {"type": ["integer", "null"]}}},
    {**SYNTHETIC, "properties": {**SYNTHETIC["properties"], "kind": {"enum": ["a", 1]}}},
    {**SYNTHETIC, "properties": {**SYNTHETIC["properties"],
                                 "tags": {"type": "array", "items": {"type": "string"}}}},
    {**SYNTHETIC, "minProperties": 1},
    {**SYNTHETIC, "additionalProperties": True},
    {**SYNTHETIC, "properties": {**SYNTHETIC["properties"], "n": {"type": "integer",
                                                                  "minimum": 0.5}}},
], ids=["number", "format", "type-list", "mixed-enum", "array", "minProperties",
        "additional", "float-bound"])
def test_schemas_outside_the_subset_always_take_the_full_validator(schema):
    assert quick_acceptance(schema) is None
