"""The review queue with 100,000 open cases: wall time of a first page, a deep page, a tab and
a filtered view, on a throwaway PostgreSQL database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/agent_ledger \\
        .venv/bin/python bench/queue_scale.py [--cases 100000]

Prints the median of five requests per view and each view's ratio to the first page measured
in the same run (only ratios are meaningful on a shared machine). The structural guarantees —
no OFFSET, a bounded number of queries, the partial index in every plan — are asserted by
tests/review/test_queue_scale.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=100_000)
    args = parser.parse_args()
    sys.path.insert(0, str(PROJECT_ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LEDGER_VAR_DIR", tempfile.mkdtemp(prefix="agent-ledger-queue-"))
    os.environ["LEDGER_TEST_DB_SUFFIX"] = f"queue_{os.getpid()}"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        print("set DATABASE_URL=postgres://… (the queue's partial indexes are PostgreSQL's)")
        return 2
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        run(args.cases)
    finally:
        connection.close()
        connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)
    return 0


def run(cases: int) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.test import Client
    from django.urls import reverse

    from ledger.auth import agent_create
    from reconciliation.models import Case
    from tests.review.test_queue_scale import seed_open_cases

    agent, _ = agent_create(name="bench-queue", tools=["refund"])
    started = time.perf_counter()
    seed_open_cases(agent, cases)
    print(f"seeded {cases} open cases in {time.perf_counter() - started:.1f} s")
    user = get_user_model().objects.create_user("bench-reviewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="review_case"))
    client = Client()
    client.force_login(user)
    deep = Case.objects.order_by("review_deadline_at", "-value_amount", "pk").values_list(
        "pk", flat=True)[int(cases * 0.8)]
    views = {
        "first page": {},
        "page at 80 %": {"tab": "all", "after": deep},
        "unclaimed tab": {"tab": "unclaimed"},
        "filtered": {"tab": "all", "reason": "anomaly", "min_value": "1000"},
    }
    medians = {}
    for name, params in views.items():
        samples = []
        for _ in range(5):
            begun = time.perf_counter()
            assert client.get(reverse("review:queue"), params).status_code == 200
            samples.append(time.perf_counter() - begun)
        medians[name] = statistics.median(samples)
    for name, seconds in medians.items():
        print(f"{name:14} median {seconds * 1000:7.1f} ms   "
              f"ratio to first page {seconds / medians['first page']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
