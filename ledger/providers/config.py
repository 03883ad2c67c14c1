"""Reading one connector's settings from the catalogue, strictly.

Every connector builds itself from a plain mapping (a table of the catalogue file) through a
`SettingsReader`, which refuses unknown keys and wrong types with the key's dotted name, and
resolves the two kinds of references a value may hold:

- `env:NAME` — read from the environment once, when the catalogue is loaded. The only way a
  secret (an API key, a password, an Authorization header) may reach a connector: the catalogue
  file, the database, logs and pages never hold the value itself.
- `setting:NAME` — a Django setting, read at call time (non-secret values only: addresses,
  ports). The demo catalogue points at the sandbox this way, so tests can move the sandbox.

Connectors never import the tool registry: the catalogue imports them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "env:"
SETTING_PREFIX = "setting:"


class ConnectorConfigError(ValueError):
    """One thing wrong with one key of a connector's settings."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class Secret:
    """A value read from the environment; its repr never shows it."""

    env_name: str
    value: str

    def __repr__(self) -> str:
        return f"Secret(env:{self.env_name})"

    __str__ = __repr__


def from_setting(name: str) -> Callable[[], Any]:
    def read() -> Any:
        from django.conf import settings

        return getattr(settings, name)

    return read


def constant(value: Any) -> Callable[[], Any]:
    return lambda: value


class SettingsReader:
    """Typed access to one table; `finish()` refuses whatever key nobody asked for."""

    def __init__(self, table: Mapping[str, Any], *, prefix: str) -> None:
        if not isinstance(table, Mapping):
            raise ConnectorConfigError(prefix, "must be a table")
        self._table = table
        self._prefix = prefix
        self._seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self._prefix}.{name}"

    def has(self, name: str) -> bool:
        return name in self._table

    def raw(self, name: str, default: Any = None) -> Any:
        self._seen.add(name)
        return self._table.get(name, default)

    def string(self, name: str, default: str | None = None) -> str:
        value = self.raw(name, default)
        if value is None:
            raise ConnectorConfigError(self.key(name), "is required")
        if not isinstance(value, str):
            raise ConnectorConfigError(self.key(name), "must be a string")
        return value

    def optional_string(self, name: str) -> str | None:
        if not self.has(name):
            self._seen.add(name)
            return None
        return self.string(name)

    def integer(self, name: str, default: int | None = None, *, minimum: int = 0) -> int:
        value = self.raw(name, default)
        if value is None:
            raise ConnectorConfigError(self.key(name), "is required")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConnectorConfigError(self.key(name), "must be an integer")
        if value < minimum:
            raise ConnectorConfigError(self.key(name), f"must be at least {minimum}")
        return value

    def number(self, name: str, default: float) -> float:
        value = self.raw(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConnectorConfigError(self.key(name), "must be a non-negative number")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name, default)
        if not isinstance(value, bool):
            raise ConnectorConfigError(self.key(name), "must be true or false")
        return value

    def int_list(self, name: str, default: tuple[int, ...]) -> frozenset[int]:
        value = self.raw(name, list(default))
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599 for v in value
        ):
            raise ConnectorConfigError(self.key(name), "must be a list of HTTP status codes")
        return frozenset(value)

    def table(self, name: str) -> SettingsReader | None:
        if not self.has(name):
            self._seen.add(name)
            return None
        return SettingsReader(self.raw(name), prefix=self.key(name))

    def string_table(self, name: str) -> dict[str, str]:
        value = self.raw(name, {})
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ConnectorConfigError(self.key(name), "must be a table of strings")
        return dict(value)

    def secret(self, name: str, *, required: bool = True) -> Secret | None:
        """A value that may only come from the environment (`env:NAME`)."""
        value = self.raw(name)
        if value is None:
            if required:
                raise ConnectorConfigError(self.key(name), "is required (as env:NAME)")
            return None
        if not isinstance(value, str) or not value.startswith(ENV_PREFIX):
            raise ConnectorConfigError(
                self.key(name),
                "a secret must be a reference to an environment variable (env:NAME), "
                "never the value itself")
        return resolve_env(self.key(name), value)

    def address(self, name: str, default: str | int | None = None) -> Callable[[], Any]:
        """A non-secret value: literal, `env:NAME` (read now) or `setting:NAME` (read per call)."""
        value = self.raw(name, default)
        if value is None:
            raise ConnectorConfigError(self.key(name), "is required")
        if isinstance(value, str) and value.startswith(SETTING_PREFIX):
            setting = value.removeprefix(SETTING_PREFIX)
            from django.conf import settings

            if not hasattr(settings, setting):
                raise ConnectorConfigError(self.key(name), f"names no Django setting {setting!r}")
            return from_setting(setting)
        if isinstance(value, str) and value.startswith(ENV_PREFIX):
            return constant(resolve_env(self.key(name), value).value)
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConnectorConfigError(self.key(name), "must be a string or an integer")
        return constant(value)

    def finish(self) -> None:
        unknown = sorted(set(self._table) - self._seen)
        if unknown:
            raise ConnectorConfigError(self.key(unknown[0]), "unknown key")


def resolve_env(key: str, reference: str) -> Secret:
    env_name = reference.removeprefix(ENV_PREFIX)
    if not env_name:
        raise ConnectorConfigError(key, "env: needs a variable name")
    value = os.environ.get(env_name)
    if value is None:
        raise ConnectorConfigError(key, f"environment variable {env_name} is not set")
    return Secret(env_name, value)
