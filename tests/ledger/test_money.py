"""Money display and typing: the currency's ISO 4217 exponent decides the decimals, Django's
active locale decides how they look."""

from __future__ import annotations

import pytest
from django.utils import translation

from ledger.money import currency_exponent, format_amount, format_money, parse_money


@pytest.mark.parametrize(("currency", "exponent"), [("JPY", 0), ("EUR", 2), ("USD", 2),
                                                     ("KWD", 3), ("BHD", 3), ("CLF", 4)])
def test_currency_exponent_comes_from_iso_4217(currency: str, exponent: int) -> None:
    assert currency_exponent(currency) == exponent


@pytest.mark.parametrize("code", ["ZZZ", "eur", "", "EURO"])
def test_unknown_currency_has_no_exponent(code: str) -> None:
    with pytest.raises(ValueError, match="ISO 4217"):
        currency_exponent(code)


@pytest.mark.parametrize(("amount", "currency", "shown"), [
    (2500, "JPY", "¥2,500"),
    (2500, "KWD", "2.500\xa0KWD"),  # no-break space: never split from its number
    (2500, "EUR", "€25.00"),
    (1_000_000, "EUR", "€10,000.00"),
    (5, "USD", "$0.05"),
    (0, "JPY", "¥0"),
])
def test_format_money_in_english(amount: int, currency: str, shown: str) -> None:
    with translation.override("en"):
        assert format_money(amount, currency) == shown


def test_format_money_follows_the_active_locale() -> None:
    with translation.override("de"):
        assert format_money(2500, "EUR") == "25,00\xa0€"
        assert format_money(2500, "KWD") == "2,500\xa0KWD"
    assert format_money(2500, "EUR", locale="fr") == "25,00\xa0€"


def test_unknown_currency_shows_raw_minor_units_rather_than_a_guess() -> None:
    assert format_money(5, "ZZZ") == "5 ZZZ (minor units)"


@pytest.mark.parametrize(("typed", "currency", "minor"), [
    ("2,500", "JPY", 2500),
    ("¥2,500", "JPY", 2500),
    ("2.500", "KWD", 2500),
    ("2.500 KWD", "KWD", 2500),
    ("2.5", "KWD", 2500),
    ("25.00", "EUR", 2500),
    ("€25", "EUR", 2500),
    (" 10,000.00 ", "EUR", 1_000_000),
])
def test_parse_money_uses_the_currency_exponent(typed: str, currency: str, minor: int) -> None:
    with translation.override("en"):
        assert parse_money(typed, currency) == minor


@pytest.mark.parametrize(("typed", "currency", "message"), [
    ("2.5", "JPY", "JPY amounts have no decimals"),
    ("1.2345", "KWD", "at most 3 decimals"),
    ("25.001", "EUR", "at most 2 decimals"),
    ("-1", "EUR", "cannot be negative"),
    ("1e3", "EUR", "not an amount"),
    ("NaN", "EUR", "not an amount"),
    ("abc", "EUR", "not an amount"),
    ("25,00", "EUR", "not an amount"),  # in English that is neither 25 nor 2,500
    ("", "EUR", "Enter an amount"),
])
def test_parse_money_refuses_what_it_cannot_read_exactly(typed: str, currency: str,
                                                          message: str) -> None:
    with translation.override("en"), pytest.raises(ValueError, match=message):
        parse_money(typed, currency)


def test_parse_money_reads_the_active_locale() -> None:
    with translation.override("de"):
        assert parse_money("25,00", "EUR") == 2500
        assert parse_money("2.500", "JPY") == 2500


def test_format_amount_round_trips_through_parse_money() -> None:
    for amount, currency in [(2500, "JPY"), (2500, "KWD"), (2500, "EUR"), (7, "BHD")]:
        assert parse_money(format_amount(amount, currency), currency) == amount


def test_decimals_are_counted_as_typed() -> None:
    with pytest.raises(ValueError, match="JPY amounts have no decimals"):
        parse_money("25.00", "JPY", locale="en")
    with pytest.raises(ValueError, match="at most 2 decimals"):
        parse_money("25.000", "EUR", locale="en")
    assert parse_money("2.50", "KWD", locale="en") == 2500
