"""Money for people: amounts are integers in minor units everywhere; only display and typing
know about decimals, and the number of decimals comes from the currency (ISO 4217 exponent,
from Babel's CLDR data), never a hard-coded 100.

    format_money(2500, "JPY") == "¥2,500"      (exponent 0)
    format_money(2500, "KWD") == "2.500\xa0KWD"  (exponent 3; no symbol in English)
    format_money(2500, "EUR") == "€25.00"      (exponent 2)

Display follows the locale Django is set to (the active language), or the one passed in.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation

from babel import Locale, UnknownLocaleError
from babel.numbers import (
    NumberFormatError,
    format_currency,
    format_decimal,
    get_currency_precision,
    get_currency_symbol,
    parse_decimal,
)
from django.utils import translation

FALLBACK_LOCALE = "en"
# What a typed amount may contain besides the currency: digits and the separators locales use
# (no exponent, no sign: "1e3" or "-5" are not amounts a reviewer means).
_DIGITS_AND_SEPARATORS = re.compile(r"[0-9][0-9 .,'\u2019]*")


def is_currency(currency: str) -> bool:
    """An ISO 4217 code that Babel's CLDR data knows (active or historic)."""
    return isinstance(currency, str) and currency in _iso_codes()


@functools.cache
def _iso_codes() -> frozenset[str]:
    return frozenset(Locale.parse(FALLBACK_LOCALE).currencies)


def currency_exponent(currency: str) -> int:
    """Decimals of the currency's minor unit (JPY 0, EUR 2, KWD 3). ValueError if unknown."""
    if not is_currency(currency):
        raise ValueError(f"{currency!r} is not an ISO 4217 currency code")
    return int(get_currency_precision(currency))


def active_locale(locale: str | None = None) -> Locale:
    """The Babel locale for `locale`, or for Django's active language."""
    name = locale or translation.get_language() or FALLBACK_LOCALE
    try:
        return Locale.parse(translation.to_locale(name))
    except (UnknownLocaleError, ValueError):
        return Locale.parse(FALLBACK_LOCALE)


def to_major(amount_minor: int, currency: str) -> Decimal:
    return Decimal(amount_minor).scaleb(-currency_exponent(currency))


def format_money(amount_minor: int, currency: str, locale: str | None = None) -> str:
    """The amount as people read it in the locale: symbol where the locale has one, else the
    ISO code after the number. An unknown currency shows the raw minor units, never a guess."""
    if not is_currency(currency):
        return f"{amount_minor} {currency} (minor units)".strip()
    babel_locale = active_locale(locale)
    value = to_major(amount_minor, currency)
    if get_currency_symbol(currency, locale=babel_locale) == currency:
        # No symbol in this locale: "2.500 KWD" reads better than Babel's "KWD2.500".
        pattern = "#,##0.00\u00a0¤;-#,##0.00\u00a0¤"
        return str(format_currency(value, currency, format=pattern, locale=babel_locale,
                                   currency_digits=True))
    return str(format_currency(value, currency, locale=babel_locale, currency_digits=True))


def format_amount(amount_minor: int, currency: str, locale: str | None = None) -> str:
    """The number alone, with the currency's decimals ("2.500"): what a form field shows."""
    exponent = currency_exponent(currency)
    pattern = "0" if exponent == 0 else "0." + "0" * exponent
    return str(format_decimal(to_major(amount_minor, currency), format=pattern,
                              locale=active_locale(locale), decimal_quantization=False))


def parse_money(text: str, currency: str, locale: str | None = None) -> int:
    """What a person typed ("2,500", "25.00", "¥2,500", "2.500 KWD") → minor units.

    Parsed in the locale (grouping and decimal separators), with the currency's exponent: more
    decimals than the currency has, a negative amount, or anything that is not a number raises
    ValueError with a message fit to show next to the field.
    """
    exponent = currency_exponent(currency)
    babel_locale = active_locale(locale)
    cleaned = (text or "").strip()
    for token in (currency, get_currency_symbol(currency, locale=babel_locale)):
        cleaned = cleaned.replace(token, "")
    cleaned = cleaned.replace("\u00a0", " ").replace("\u202f", " ").strip()
    if not cleaned:
        raise ValueError("Enter an amount.")
    if cleaned.startswith(("-", "\u2212")):
        raise ValueError("The amount cannot be negative.")
    if not _DIGITS_AND_SEPARATORS.fullmatch(cleaned):
        raise ValueError(f"“{text.strip()}” is not an amount in {currency}.")
    try:
        value = parse_decimal(cleaned, locale=babel_locale, strict=True)
    except (NumberFormatError, InvalidOperation):
        raise ValueError(f"“{text.strip()}” is not an amount in {currency}.") from None
    if not value.is_finite():
        raise ValueError(f"“{text.strip()}” is not an amount in {currency}.")
    exponent_of_value = value.as_tuple().exponent  # as typed: "25.00" yen is a mistake
    assert isinstance(exponent_of_value, int)  # finite, checked above
    if -exponent_of_value > exponent:
        decimals = "no decimals" if exponent == 0 else f"at most {exponent} decimals"
        raise ValueError(f"{currency} amounts have {decimals}.")
    return int(value.scaleb(exponent))
