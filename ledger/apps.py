from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Action ledger"

    def ready(self) -> None:
        from config import checks  # noqa: F401  (registers the production system checks)
        from ledger import schema  # noqa: F401  (registers the OpenAPI auth extension)
