from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "ops"
    verbose_name = "Operators' dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery.signals import task_postrun
        from django.core.signals import request_finished

        from ledger import tally
        from ops import heartbeats, rollup

        # The ledger counts replays and conflicts in memory; this app stores them.
        tally.set_sink(rollup.tally_sink)
        request_finished.connect(tally.flush_if_due, dispatch_uid="ops-tally-flush")
        task_postrun.connect(heartbeats.record_sweep_finished, dispatch_uid="ops-sweep-heartbeat")
