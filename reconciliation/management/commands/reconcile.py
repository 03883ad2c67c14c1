"""manage.py reconcile: run the sweeps by hand (or in a loop, where no Celery beat runs)."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import executor
from reconciliation import health, services, transitions
from reconciliation.models import Case


class Command(BaseCommand):
    help = ("Turn in_flight rows past their lease into unknown, reconcile every due case (or "
            "one case with --case), and send prepared operations nobody sent (the unsent "
            "sweeper). --loop repeats every LEDGER_SWEEP_INTERVAL_SECONDS.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--case", type=int, help="check this case now, due or not")
        parser.add_argument("--loop", action="store_true", help="sweep until interrupted")
        parser.add_argument("--batch-size", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["case"] is not None:
            self._one(options["case"])
            return
        while True:
            self._sweep(options["batch_size"])
            if not options["loop"]:
                return
            time.sleep(settings.LEDGER_SWEEP_INTERVAL_SECONDS)

    def _one(self, case_id: int) -> None:
        case = Case.objects.filter(pk=case_id).first()
        if case is None:
            raise CommandError(f"no case {case_id}")
        transitions.case_check_soon(case=case, actor="operator:manage.py",
                                    reason="check_requested")
        self.stdout.write(f"case {case_id}: {services.reconcile_case_now(case_id=case_id)}")

    def _sweep(self, batch_size: int | None) -> None:
        expired = services.sweep_expired_leases()
        health.record_sweep_finished("leases")
        report = services.sweep_due_cases(batch_size=batch_size)
        health.record_sweep_finished("cases")
        # Where no Celery beat runs, nothing else sends a prepared operation whose message
        # was lost (or an async submission with no worker): the same sweep beat runs.
        sent = executor.retry_unsent()
        health.record_sweep_finished("unsent")
        self.stdout.write(f"leases expired: {expired}; cases: {report.as_dict()}; "
                          f"unsent sent: {sent}")
