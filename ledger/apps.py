from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Action ledger"

    def ready(self) -> None:
        from ledger import (  # noqa: F401
            checks,  # registers the catalogue checks
            schema,  # registers the OpenAPI auth extension
            tasks,  # registers the tasks services enqueue by name
            tools,
        )

        # Read and validated once, here; a broken catalogue is kept for `manage.py check` to
        # report in full and refused by every read (the web and worker processes refuse to
        # start: config/wsgi.py, config/celery.py).
        tools.load()
