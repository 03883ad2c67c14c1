"""The chaos run in the suite: 200+ operations through the API by concurrent clients, the
sandbox's chaos mode on with every fault kind, some IDs submitted two or three times; then the
sweeps until convergence. bench/chaos.py is the same driver at 5,000 operations."""

from __future__ import annotations

import pytest
from django.utils import timezone

from bench.chaos import ALL_FAULTS, ChaosConfig, ShiftedClock, run_chaos
from ledger.models import Operation

S = Operation.Status


@pytest.mark.django_db(transaction=True)
def test_chaos_run_converges_with_at_most_one_effect_per_operation(sandbox, time_machine):
    time_machine.move_to(timezone.now(), tick=True)
    config = ChaosConfig(operations=210, clients=12, agents=8, sweepers=3,
                         chaos_probability=0.35, high_value_share=0.3, seed=11,
                         converge_timeout=120)

    report = run_chaos(config, sandbox, ShiftedClock(time_machine.shift, sandbox))

    print("\n".join(report.lines()))
    assert report.operations == 210 and report.resubmitted_ids > 20
    assert report.missing == [] and report.duplicate_effects == {}
    assert report.violations == []
    assert set(report.statuses) <= {S.SUCCEEDED, S.FAILED, S.UNKNOWN}  # unknown = in review
    assert report.statuses[S.SUCCEEDED] > 100 and report.statuses[S.FAILED] > 0
    assert report.review_reasons["high_value"] > 0
    assert set(report.faults_injected) == set(ALL_FAULTS)  # every fault kind really happened
    # Each succeeded operation has its one effect; one in review may have one, or none.
    succeeded, in_review = report.statuses[S.SUCCEEDED], report.statuses[S.UNKNOWN]
    assert succeeded <= report.effects <= succeeded + in_review
