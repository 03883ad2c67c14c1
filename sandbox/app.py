"""Process-wide state shared by all request threads: storage, runtime config, chaos dice."""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from typing import Any

from sandbox.config import SandboxConfig
from sandbox.store import Store


class Sandbox:
    def __init__(self, store: Store, defaults: SandboxConfig) -> None:
        self.store = store
        self.defaults = defaults
        self._config = defaults
        self._lock = threading.Lock()
        self._rng = random.Random(defaults.chaos_seed)
        # Set once the SMTP listener is bound (`--smtp-port`); reported by the health check.
        self.smtp_port: int | None = None

    @property
    def config(self) -> SandboxConfig:
        # Replaced wholesale under the lock, so a reader always sees one consistent snapshot.
        return self._config

    def configure(self, changes: Mapping[str, Any]) -> SandboxConfig:
        with self._lock:
            self._config = self._config.updated(changes)
            # Giving a seed restarts the sequence, so a test can replay the same fault pattern.
            if "chaos_seed" in changes:
                self._rng = random.Random(self._config.chaos_seed)
            return self._config

    def reset_config(self) -> None:
        with self._lock:
            self._config = self.defaults
            self._rng = random.Random(self.defaults.chaos_seed)

    def roll_chaos(self) -> str | None:
        with self._lock:
            config = self._config
            # No draw while chaos is off: the seeded sequence advances only on requests it can hit.
            if config.chaos_probability <= 0 or not config.chaos_faults:
                return None
            if self._rng.random() >= config.chaos_probability:
                return None
            return self._rng.choice(config.chaos_faults)
