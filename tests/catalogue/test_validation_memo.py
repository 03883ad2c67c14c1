"""Tool.validate remembers its verdict per distinct params (a retry sends the same ones): the
remembered answer is the one validation gives, and a caller cannot change it."""

from __future__ import annotations

import pytest

from ledger import catalogue
from ledger.executor import has_hidden_characters
from ledger.tools import get_tool


@pytest.fixture
def refund():
    tool = get_tool("refund")
    tool._verdicts.clear()
    return tool


GOOD = {"invoice": "inv-1", "amount": 2500, "currency": "EUR", "payee": "cus_1"}


def test_a_remembered_verdict_is_the_one_validation_gives(refund):
    bad = {**GOOD, "amount": "lots", "surprise": 1}
    first = refund.validate(bad)
    assert first == refund._validate(bad) and set(first) == {"amount", "surprise"}
    assert refund.validate(bad) == first
    assert refund.validate(GOOD) == {} == refund._validate(GOOD)
    assert len(refund._verdicts) == 2


def test_changing_a_returned_verdict_changes_nothing_remembered(refund):
    bad = {**GOOD, "amount": "lots"}
    refund.validate(bad)["amount"] = "tampered"
    refund.validate(bad).clear()
    assert refund.validate(bad) == refund._validate(bad) != {}


def test_values_that_print_alike_but_differ_in_type_are_judged_apart(refund):
    as_int, as_float, as_bool = ({**GOOD, "amount": v} for v in (1, 1.0, True))
    assert refund.validate(as_int) == {}
    assert refund.validate(as_float) != {} and refund.validate(as_bool) != {}


def test_the_memory_is_bounded(refund, monkeypatch):
    monkeypatch.setattr(catalogue, "VERDICTS_KEPT", 3)
    for n in range(10):
        refund.validate({**GOOD, "invoice": f"inv-{n}"})
    assert len(refund._verdicts) <= 3
    huge = {**GOOD, "invoice": "x" * (catalogue.VERDICT_KEY_MAX + 1)}
    refund.validate(huge)
    assert repr(huge) not in refund._verdicts


@pytest.mark.parametrize(("text", "hidden"), [
    ("cus_123", False), ("a b-c.d", False), ("tab\there", True), ("nul\x00", True),
    ("del\x7f", True), ("cus_\u200b123", True), ("r\u202eevil", True), ("café", False),
])
def test_the_printable_ascii_shortcut_agrees_with_the_categories(text, hidden):
    assert has_hidden_characters(text) is hidden
