from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Action ledger"

    def ready(self) -> None:
        from ledger import (
            schema,  # noqa: F401  (registers the OpenAPI auth extension)
            tasks,  # noqa: F401  (registers the tasks services enqueue by name)
        )
