"""Runtime configuration of the sandbox provider and the fault vocabulary it understands."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

MAGIC_PREFIX = "sandbox:"

# Faults without a parameter; `lookup-lag-<N>` is the one parameterised fault.
SIMPLE_FAULTS = frozenset(
    {"lose-response", "timeout", "500-after-commit", "drop-before-commit", "reject", "rate-limit"}
)
LOOKUP_LAG = re.compile(r"lookup-lag-(\d+)")

DEFAULT_CHAOS_FAULTS = (
    "lose-response",
    "timeout",
    "500-after-commit",
    "drop-before-commit",
    "reject",
    "lookup-lag-2",
)

ENV_VARS = {
    "chaos_probability": "SANDBOX_CHAOS_PROBABILITY",
    "chaos_seed": "SANDBOX_CHAOS_SEED",
    "chaos_faults": "SANDBOX_CHAOS_FAULTS",
    "index_lag_seconds": "SANDBOX_INDEX_LAG_SECONDS",
    "timeout_sleep_seconds": "SANDBOX_TIMEOUT_SLEEP_SECONDS",
    "key_retention_seconds": "SANDBOX_KEY_RETENTION_SECONDS",
}


class ConfigError(ValueError):
    """A configuration value (from the environment or the control API) is not acceptable."""


def is_fault(name: str) -> bool:
    return name in SIMPLE_FAULTS or LOOKUP_LAG.fullmatch(name) is not None


def lag_of(fault: str | None) -> float:
    """Per-effect lookup lag in seconds that a fault asks for (0 for every other fault)."""
    match = LOOKUP_LAG.fullmatch(fault or "")
    return float(match.group(1)) if match else 0.0


def _number(name: str, value: Any) -> float:
    # bool is an int subclass; `true` must not silently become 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{name} must be a number")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number") from None
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be finite")
    return number


def _probability(value: Any) -> float:
    number = _number("chaos_probability", value)
    if not 0.0 <= number <= 1.0:
        raise ConfigError("chaos_probability must be between 0 and 1")
    return number


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError("chaos_seed must be an integer")
    try:
        return int(value)
    except ValueError:
        raise ConfigError("chaos_seed must be an integer") from None


def _faults(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        names = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple) and all(isinstance(part, str) for part in value):
        names = [part.strip() for part in value]
    else:
        raise ConfigError("chaos_faults must be a comma-separated string or a list of strings")
    names = [name.removeprefix(MAGIC_PREFIX) for name in names if name]
    unknown = [name for name in names if not is_fault(name)]
    if unknown:
        raise ConfigError(f"unknown chaos faults: {', '.join(unknown)}")
    return tuple(names)


def _non_negative(name: str) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        number = _number(name, value)
        if number < 0:
            raise ConfigError(f"{name} must not be negative")
        return number

    return parse


def _positive(name: str) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        number = _number(name, value)
        if number <= 0:
            raise ConfigError(f"{name} must be positive")
        return number

    return parse


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "chaos_probability": _probability,
    "chaos_seed": _seed,
    "chaos_faults": _faults,
    "index_lag_seconds": _non_negative("index_lag_seconds"),
    "timeout_sleep_seconds": _non_negative("timeout_sleep_seconds"),
    "key_retention_seconds": _positive("key_retention_seconds"),
}


@dataclass(frozen=True)
class SandboxConfig:
    chaos_probability: float = 0.0
    chaos_seed: int = 0
    chaos_faults: tuple[str, ...] = DEFAULT_CHAOS_FAULTS
    index_lag_seconds: float = 0.0
    timeout_sleep_seconds: float = 5.0
    key_retention_seconds: float = 86400.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SandboxConfig:
        return cls().updated({name: env[var] for name, var in ENV_VARS.items() if var in env})

    def updated(self, changes: Mapping[str, Any]) -> SandboxConfig:
        unknown = sorted(set(changes) - set(_PARSERS))
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(unknown)}")
        return replace(self, **{name: _PARSERS[name](value) for name, value in changes.items()})

    def as_json(self) -> dict[str, Any]:
        data = {field.name: getattr(self, field.name) for field in fields(self)}
        data["chaos_faults"] = list(self.chaos_faults)
        return data
