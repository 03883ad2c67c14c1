"""The tool catalogue: a TOML file (LEDGER_TOOLS_FILE) read once into frozen Tool objects.

Everything an operator may get wrong is refused here, when the file is loaded — at start-up and
by `manage.py check` — with the tool, the key and what is wrong; never at send time. The hot
path (ledger.tools.get_tool) reads the objects built here, never the file or the database.

The format is documented in README ("Guard your own tool"); config/tools.toml is the demo.
"""

from __future__ import annotations

import hashlib
import operator
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache, partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

from babel.numbers import list_currencies
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError

from ledger.canonical import canonical_json
from ledger.providers import CONNECTORS, ConnectorContext, build_connector
from ledger.providers.base import ProviderAdapter
from ledger.providers.config import ConnectorConfigError, SettingsReader

TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
PROVIDER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
FLOAT_MESSAGE = "must be an integer in minor units; decimals and floats are not accepted"


class CatalogueError(Exception):
    """Everything wrong with a catalogue, one line per problem."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__(f"tool catalogue {path}: " + "; ".join(problems))
        self.path = path
        self.problems = problems


class _EntryError(Exception):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


# --- params validation (JSON Schema draft 2020-12) ---------------------------------------------

def _is_integer(checker: Any, instance: Any) -> bool:
    # The draft counts 25.0 as an integer; money is never a float here, so it does not.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _anchored(pattern: str) -> str:
    # In ECMA 262 (the schema's dialect) `$` ends the string; in Python it also matches before
    # a final newline, which would let "invoice-17\n" through.
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") \
        else pattern


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(_anchored(pattern))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if isinstance(instance, str) and not _compiled(pattern).search(instance):
        yield ValidationError(f"does not match {pattern!r}")


LedgerValidator = validators.extend(
    Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


# Keywords that only annotate: they never make an instance invalid.
_ANNOTATIONS = frozenset({"title", "description", "$comment", "examples", "default",
                          "deprecated", "readOnly", "writeOnly"})
_QUICK_PROPERTY_KEYWORDS = _ANNOTATIONS | {"type", "pattern", "minLength", "maxLength", "enum",
                                           "minimum", "maximum", "exclusiveMinimum",
                                           "exclusiveMaximum"}
_QUICK_TYPES = {"string": str, "integer": int, "boolean": bool}
# A bound keyword and what must hold between an integer and it.
_BOUNDS = {"minimum": operator.ge, "maximum": operator.le, "exclusiveMinimum": operator.gt,
           "exclusiveMaximum": operator.lt}


def quick_acceptance(schema: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool] | None:
    """For a params schema within a plain subset (an object of string, integer and boolean
    properties with patterns, lengths, bounds and string enums, `required`, no additional
    properties), a check that answers True only for params the full validator accepts; False
    means "ask the full validator", which also words the errors. None: the schema uses
    something outside the subset, so every call takes the full validator.

    It exists because the full validator costs a fresh action more than its statements' Python
    (bench/peers.py); tests/catalogue/test_quick_acceptance.py checks it never accepts what
    the full validator refuses."""
    if set(schema) - _ANNOTATIONS - {"type", "properties", "required", "additionalProperties"}:
        return None
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        return None
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, spec in schema["properties"].items():
        check = _quick_property(spec)
        if check is None:
            return None
        checks[name] = check
    needed = frozenset(required)

    def accepts(params: Mapping[str, Any]) -> bool:
        if not needed <= params.keys():
            return False
        for name, value in params.items():
            check = checks.get(name)
            if check is None or not check(value):
                return False
        return True

    return accepts


def _holds(relation: Callable[[Any, Any], bool], bound: int, value: int) -> bool:
    return relation(value, bound)


def _quick_property(spec: Any) -> Callable[[Any], bool] | None:
    if not isinstance(spec, Mapping) or set(spec) - _QUICK_PROPERTY_KEYWORDS:
        return None
    declared = spec.get("type")
    kind = _QUICK_TYPES.get(declared) if isinstance(declared, str) else None
    if kind is None:
        return None
    tests: list[Callable[[Any], bool]] = []
    if "enum" in spec:
        choices = spec["enum"]
        if kind is not str or not isinstance(choices, list) \
                or not all(isinstance(c, str) for c in choices):
            return None
        allowed = frozenset(choices)
        tests.append(allowed.__contains__)
    if kind is str:
        if "pattern" in spec:
            search = _compiled(spec["pattern"]).search
            tests.append(lambda v: search(v) is not None)
        low, high = spec.get("minLength", 0), spec.get("maxLength")
        if type(low) is not int or (high is not None and type(high) is not int):
            return None
        tests.append(lambda v: low <= len(v) and (high is None or len(v) <= high))
    elif {"pattern", "minLength", "maxLength"} & set(spec):
        return None  # they only constrain strings: nothing to check, but keep the subset plain
    if kind is int:
        bounds = {keyword: spec[keyword] for keyword in _BOUNDS if keyword in spec}
        if not all(type(bound) is int for bound in bounds.values()):
            return None
        tests.extend(partial(_holds, _BOUNDS[keyword], bound)
                     for keyword, bound in bounds.items())
    elif _BOUNDS.keys() & set(spec):
        return None

    def check(value: Any) -> bool:
        # type() is, not isinstance: True is no integer here, and a str subclass is left to
        # the full validator.
        return type(value) is kind and all(test(value) for test in tests)

    return check


def _has_float(value: Any) -> bool:
    if isinstance(value, float | Decimal):
        return True
    if isinstance(value, Mapping):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_float(v) for v in value)
    return False


_TYPE_WORDS = {"integer": "an integer", "string": "a string", "boolean": "true or false",
               "object": "a JSON object", "array": "a list", "number": "a number"}


def _message(error: ValidationError) -> str:
    """A field-level message that never repeats the submitted value (it may be personal data)."""
    kind, expected = error.validator, error.validator_value
    if kind == "type":
        if _has_float(error.instance) and "integer" in str(expected):
            return FLOAT_MESSAGE
        words = [_TYPE_WORDS.get(t, t) for t in ([expected] if isinstance(expected, str)
                                                 else expected)]
        return f"must be {' or '.join(words)}"
    if kind == "enum":
        # Worded here, not in the table below: the table's entries are all built for every
        # error, and a number (maxLength's 20000) is no list of choices.
        return "must be one of " + ", ".join(str(v) for v in expected or ())
    return {
        "maxLength": f"must be at most {expected} characters",
        "minLength": f"must be at least {expected} characters",
        "minimum": f"must be at least {expected}",
        "maximum": f"must be at most {expected}",
        "exclusiveMinimum": f"must be more than {expected}",
        "exclusiveMaximum": f"must be less than {expected}",
        "pattern": "has an invalid format",
        "format": "has an invalid format",
        "const": "has the wrong value",
    }.get(str(kind), f"does not satisfy {kind}")


# --- the tool ----------------------------------------------------------------------------------

VERDICTS_KEPT = 1024
VERDICT_KEY_MAX = 2048


@dataclass(frozen=True)
class Tool:
    name: str
    version: int
    description: str
    params_schema: Mapping[str, Any] = field(compare=False, repr=False)
    intent_fields: tuple[str, ...]
    free_text_fields: tuple[str, ...]
    secret_fields: tuple[str, ...]
    amount_field: str | None
    currency_field: str | None
    subject_field: str
    high_value_thresholds: Mapping[str, int]
    four_eyes_thresholds: Mapping[str, int]
    lease_seconds: int
    request_timeout: float
    provider: str
    connector: str
    client_execution: bool
    unknown_sla_seconds: int
    fingerprint: str
    adapter: ProviderAdapter = field(compare=False, repr=False)
    _validator: Any = field(compare=False, repr=False)
    # Field errors of params validated before, by their repr (a retry sends the same params):
    # validation is a pure function of them and costs more than the lookup of a replay.
    _verdicts: dict[str, dict[str, str]] = field(default_factory=dict, compare=False,
                                                 repr=False)
    # quick_acceptance(params_schema), or None: every call takes _validator.
    _quick: Callable[[Mapping[str, Any]], bool] | None = field(default=None, compare=False,
                                                               repr=False)

    def validate(self, params: Any) -> dict[str, str]:
        """Field-level errors; an empty dict means the params are acceptable. A null value
        counts as absent. Remembered per distinct params (at most VERDICTS_KEPT per tool
        version, forgotten all at once when full)."""
        key = repr(params) if type(params) is dict else None
        if key is not None and len(key) <= VERDICT_KEY_MAX:
            known = self._verdicts.get(key)
            if known is not None:
                return dict(known)
            errors = self._validate(params)
            if len(self._verdicts) >= VERDICTS_KEPT:
                self._verdicts.clear()
            self._verdicts[key] = dict(errors)
            return errors
        return self._validate(params)

    def _validate(self, params: Any) -> dict[str, str]:
        if not isinstance(params, Mapping):
            return {"params": "must be a JSON object"}
        properties = self.params_schema.get("properties", {})
        present = {k: v for k, v in params.items() if v is not None or k not in properties}
        if self._quick is not None and self._quick(present):
            return {}  # only str, int and bool values: no float to refuse either
        errors: dict[str, str] = {}
        for error in self._validator.iter_errors(present):
            path = list(error.absolute_path)
            if path:
                errors.setdefault(str(path[0]), _message(error))
            elif error.validator == "required":
                for name in error.validator_value:
                    if name not in present:
                        errors.setdefault(name, "is required")
            elif error.validator in ("additionalProperties", "unevaluatedProperties"):
                for name in present:
                    if name not in properties:
                        errors.setdefault(name, f"unknown field for {self.name}")
            else:
                errors.setdefault("params", _message(error))
        for name, value in present.items():
            if name not in errors and _has_float(value):
                errors[name] = FLOAT_MESSAGE
        return errors

    def intent(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {name: params[name] for name in self.intent_fields
                if name in params and params[name] is not None}

    def redacted(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {k: ("[redacted]" if k in self.secret_fields else v) for k, v in params.items()}

    def withholds(self, params: Mapping[str, Any]) -> bool:
        """Whether these params carry a secret field, which the ledger never stores: only the
        caller that has it can send them (never a worker, a sweeper or the reconciler)."""
        return any(params.get(name) is not None for name in self.secret_fields)

    def value(self, params: Mapping[str, Any]) -> tuple[int, str] | None:
        if self.amount_field is None or self.currency_field is None:
            return None
        amount, currency = params.get(self.amount_field), params.get(self.currency_field)
        if amount is None or currency is None:
            return None
        return int(amount), str(currency)

    def subject(self, params: Mapping[str, Any]) -> str:
        return str(params.get(self.subject_field) or "")

    def is_high_value(self, amount: int | None, currency: str) -> bool:
        """At or above the currency's threshold; a currency without one is high value."""
        return _at_or_above(amount, currency, self.high_value_thresholds)

    def needs_four_eyes(self, amount: int | None, currency: str) -> bool:
        """At or above the currency's four-eyes threshold; a currency without one needs two."""
        return _at_or_above(amount, currency, self.four_eyes_thresholds)

    def resource(self) -> dict[str, Any]:
        """What agents and SDKs discover (GET /api/v1/tools): never the connector's settings."""
        value = None if self.amount_field is None else {
            "amount_field": self.amount_field, "currency_field": self.currency_field}
        return {
            "name": self.name, "version": self.version, "description": self.description,
            "params_schema": _thawed(self.params_schema),
            "intent_fields": list(self.intent_fields),
            "free_text_fields": list(self.free_text_fields),
            "secret_fields": list(self.secret_fields),
            "value": value,
            "high_value_thresholds": dict(self.high_value_thresholds),
            "four_eyes_thresholds": dict(self.four_eyes_thresholds),
            "client_execution": self.client_execution,
        }


def _at_or_above(amount: int | None, currency: str, thresholds: Mapping[str, int]) -> bool:
    if amount is None:
        return False
    threshold = thresholds.get(currency)
    return threshold is None or amount >= threshold


class FrozenDict(dict[str, Any]):
    """A dict nobody can change (still a dict: JSON, DRF and jsonschema take it as one)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("catalogue objects are read-only")

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenDict({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


def fingerprint_of(*, name: str, version: int, schema: Any, intent_fields: Any,
                   provider: str, amount_field: str | None, currency_field: str | None,
                   subject_field: str) -> str:
    """What may never change once an operation used this version."""
    payload = canonical_json({
        "name": name, "version": version, "params_schema": _thawed(schema),
        "intent_fields": list(intent_fields), "provider": provider,
        "value": [amount_field, currency_field], "subject": subject_field})
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()


# --- the catalogue -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Catalogue:
    path: str
    # name → version → Tool
    versions: Mapping[str, Mapping[int, Tool]]

    @property
    def latest(self) -> dict[str, Tool]:
        return {name: versions[max(versions)] for name, versions in self.versions.items()}


_TOOL_KEYS = frozenset({
    "name", "version", "description", "params", "intent_fields", "free_text_fields",
    "secret_fields", "value", "subject", "high_value", "four_eyes", "lease_seconds",
    "request_timeout", "client_execution", "unknown_sla_seconds", "provider"})


def load_catalogue(path: str | Path) -> Catalogue:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogueError(str(path), [f"cannot be read ({exc.strerror})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogueError(str(path), [f"is not valid TOML ({exc})"]) from None
    return catalogue_from(data, path=str(path))


def catalogue_from(data: Mapping[str, Any], *, path: str = "<catalogue>") -> Catalogue:
    problems = [f"key {key!r}: unknown top-level key (tools are [[tools]] tables)"
                for key in sorted(set(data) - {"tools"})]
    entries = data.get("tools")
    if not isinstance(entries, list) or not entries:
        problems.append("key 'tools': declare at least one [[tools]] table")
        raise CatalogueError(path, problems)
    versions: dict[str, dict[int, Tool]] = {}
    for index, entry in enumerate(entries):
        label = _label(entry, index)
        try:
            tool = _tool(entry)
        except _EntryError as exc:
            problems.append(f"{label}: key {exc.key!r}: {exc.message}")
            continue
        if tool.version in versions.get(tool.name, {}):
            problems.append(f"{label}: key 'version': declared twice")
            continue
        versions.setdefault(tool.name, {})[tool.version] = tool
    if problems:
        raise CatalogueError(path, problems)
    return Catalogue(path=path, versions=MappingProxyType(
        {name: MappingProxyType(dict(sorted(v.items()))) for name, v in versions.items()}))


def _label(entry: Any, index: int) -> str:
    if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
        version = entry.get("version")
        return f"tool {entry['name']!r}" + (f" v{version}" if isinstance(version, int) else "")
    return f"tools[{index}]"


def _str_list(entry: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _EntryError(key, "must be a list of property names")
    if len(set(value)) != len(value):
        raise _EntryError(key, "names a property twice")
    return tuple(value)


def _positive(entry: Mapping[str, Any], key: str, default: int | float, kind: type) -> Any:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or (
            kind is int and not isinstance(value, int)):
        raise _EntryError(key, f"must be a positive {'integer' if kind is int else 'number'}")
    return kind(value)


def _schema(entry: Mapping[str, Any]) -> dict[str, Any]:
    schema = entry.get("params")
    if not isinstance(schema, Mapping):
        raise _EntryError("params", "is required: the params as a JSON Schema (a table)")
    schema = dict(schema)
    try:
        LedgerValidator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise _EntryError("params" + (f".{where.replace('/', '.')}" if where else ""),
                          f"is not a valid JSON Schema (draft 2020-12): {exc.message}") from None
    if schema.get("type") != "object":
        raise _EntryError("params.type", 'must be "object"')
    if schema.get("additionalProperties") is not False:
        raise _EntryError("params.additionalProperties",
                          "must be false (unknown fields are refused, never ignored)")
    if not isinstance(schema.get("properties"), Mapping) or not schema["properties"]:
        raise _EntryError("params.properties", "declare at least one property")
    return schema


def _property_type(schema: Mapping[str, Any], name: str) -> Any:
    spec = schema["properties"].get(name)
    return spec.get("type") if isinstance(spec, Mapping) else None


def _fields(entry: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = set(schema["properties"])
    lists = {key: _str_list(entry, key)
             for key in ("intent_fields", "free_text_fields", "secret_fields")}
    if not lists["intent_fields"]:
        raise _EntryError("intent_fields", "declare the properties that define the intent")
    for key, names in lists.items():
        for name in names:
            if name not in properties:
                raise _EntryError(key, f"{name!r} is not a property of params")
    overlap = set(lists["intent_fields"]) & set(lists["free_text_fields"])
    if overlap:
        raise _EntryError("free_text_fields",
                          f"{sorted(overlap)[0]!r} is also an intent field")
    subject = entry.get("subject")
    if not isinstance(subject, str) or subject not in properties:
        raise _EntryError("subject", "must name a property of params (the business object)")
    return lists | {"subject_field": subject}


def _value(entry: Mapping[str, Any], schema: Mapping[str, Any],
           intent: tuple[str, ...]) -> tuple[str | None, str | None]:
    value = entry.get("value")
    if value is None:
        return None, None
    if not isinstance(value, Mapping) or set(value) != {"amount", "currency"}:
        raise _EntryError("value", "must be a table with exactly `amount` and `currency`")
    for part, wanted in (("amount", "integer"), ("currency", "string")):
        name = value[part]
        if not isinstance(name, str) or name not in schema["properties"]:
            raise _EntryError(f"value.{part}", f"{name!r} is not a property of params")
        if _property_type(schema, name) != wanted:
            raise _EntryError(f"value.{part}", f"{name!r} must be of type {wanted} "
                              + ("(minor units)" if part == "amount" else "(ISO 4217 code)"))
        if name not in intent:
            raise _EntryError(f"value.{part}", f"{name!r} must be an intent field")
    return value["amount"], value["currency"]


@cache
def iso_currencies() -> frozenset[str]:
    return frozenset(list_currencies())


def _thresholds(entry: Mapping[str, Any], key: str, has_value: bool) -> Mapping[str, int]:
    table = entry.get(key, {})
    if not isinstance(table, Mapping):
        raise _EntryError(key, "must be a table of currency = minor units")
    if table and not has_value:
        raise _EntryError(key, "thresholds need a `value` (amount and currency)")
    for currency, amount in table.items():
        if currency not in iso_currencies():
            raise _EntryError(f"{key}.{currency}", "is not an ISO 4217 currency code")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise _EntryError(f"{key}.{currency}", "must be an integer amount in minor units")
    return FrozenDict(table)


def _provider(entry: Mapping[str, Any], name: str, schema: Mapping[str, Any],
              intent: tuple[str, ...]) -> tuple[str, str, ProviderAdapter]:
    table = entry.get("provider")
    if not isinstance(table, Mapping):
        raise _EntryError("provider", "is required: a table with `connector` and its settings")
    table = dict(table)
    connector = table.pop("connector", None)
    if connector not in CONNECTORS:
        raise _EntryError("provider.connector",
                          f"unknown connector {connector!r} (known: {', '.join(CONNECTORS)})")
    label = table.pop("name", connector)
    if not isinstance(label, str) or not PROVIDER_NAME.fullmatch(label):
        raise _EntryError("provider.name", "must be a short name ([a-z0-9_.-])")
    context = ConnectorContext(tool=name, properties=frozenset(schema["properties"]),
                               intent_fields=intent)
    try:
        adapter = build_connector(connector, SettingsReader(table, prefix="provider"), context,
                                  name=label)
    except ConnectorConfigError as exc:
        raise _EntryError(exc.key, exc.message) from None
    return label, connector, adapter


def _tool(entry: Any) -> Tool:
    if not isinstance(entry, Mapping):
        raise _EntryError("tools", "each [[tools]] entry must be a table")
    unknown = sorted(set(entry) - _TOOL_KEYS)
    if unknown:
        raise _EntryError(unknown[0], "unknown key")
    name = entry.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise _EntryError("name", "must be a lowercase name ([a-z][a-z0-9_]*)")
    version = entry.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _EntryError("version", "must be a positive integer")
    description = entry.get("description", "")
    if not isinstance(description, str) or not description.strip():
        raise _EntryError("description", "is required (agents read it)")
    schema = _schema(entry)
    names = _fields(entry, schema)
    amount_field, currency_field = _value(entry, schema, names["intent_fields"])
    thresholds = {key: _thresholds(entry, key, amount_field is not None)
                  for key in ("high_value", "four_eyes")}
    client_execution = entry.get("client_execution", True)
    if not isinstance(client_execution, bool):
        raise _EntryError("client_execution", "must be true or false")
    label, connector, adapter = _provider(entry, name, schema, names["intent_fields"])
    if not adapter.capabilities.can_send and not client_execution:
        raise _EntryError("provider.send",
                          "a lookup-only connector needs client_execution = true")
    return Tool(
        name=name, version=version, description=description.strip(),
        params_schema=_frozen(schema), intent_fields=names["intent_fields"],
        free_text_fields=names["free_text_fields"], secret_fields=names["secret_fields"],
        amount_field=amount_field, currency_field=currency_field,
        subject_field=names["subject_field"],
        high_value_thresholds=thresholds["high_value"],
        four_eyes_thresholds=thresholds["four_eyes"],
        lease_seconds=_positive(entry, "lease_seconds", 60, int),
        request_timeout=_positive(entry, "request_timeout", 10.0, float),
        provider=label, connector=str(connector), client_execution=client_execution,
        unknown_sla_seconds=_positive(entry, "unknown_sla_seconds", 900, int),
        fingerprint=fingerprint_of(
            name=name, version=version, schema=schema, intent_fields=names["intent_fields"],
            provider=label, amount_field=amount_field, currency_field=currency_field,
            subject_field=names["subject_field"]),
        adapter=adapter,
        _validator=LedgerValidator(schema),
        _quick=quick_acceptance(schema),
    )
