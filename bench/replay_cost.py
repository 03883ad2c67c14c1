"""Cost of a fresh action versus a replay, through the real API against the sandbox provider.

    .venv/bin/python bench/replay_cost.py [--operations 300]

Prints wall time per call and the replay/fresh ratio measured in one run (these machines are
shared and noisy, so only the ratio is meaningful), plus queries and commits per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("LEDGER_VAR_DIR", tempfile.mkdtemp(prefix="ledger-bench-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--operations", type=int, default=300)
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from rest_framework.test import APIClient

    from ledger.auth import agent_create
    from sandbox.testing import SandboxServer

    call_command("migrate", verbosity=0)
    _, token = agent_create(name=f"bench-{time.time_ns()}", tools=["refund"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def body(i: int) -> dict:
        return {"operation_id": f"bench:{os.getpid()}:refund-{i}:v1", "tool": "refund",
                "params": {"invoice": f"inv-{i}", "amount": 100 + i, "currency": "EUR",
                           "payee": "cus_bench"}}

    with SandboxServer() as sandbox:
        from django.conf import settings

        settings.SANDBOX_URL = sandbox.url
        fresh = _pass(client, body, args.operations, expect=201)
        replay = _pass(client, body, args.operations, expect=200)

    print(f"database: {connection.vendor}, operations: {args.operations}")
    for name, figures in (("fresh ", fresh), ("replay", replay)):
        print(f"{name}: median {figures.median_ms:7.2f} ms   queries/call "
              f"{figures.queries_per_call:.2f}   commits/call {figures.commits_per_call:.2f}")
    print(f"replay/fresh time ratio: {replay.median_ms / fresh.median_ms:.3f}")


@dataclass(frozen=True)
class Figures:
    median_ms: float
    queries_per_call: float
    commits_per_call: float


def _pass(client: Any, body: Callable[[int], dict], count: int, *, expect: int) -> Figures:
    """Submit body(0..count-1) once each, counting time, queries and commits."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    seconds = []
    with CaptureQueriesContext(connection) as queries, mock.patch.object(
        connection, "commit", wraps=connection.commit
    ) as commits:
        for i in range(count):
            started = time.perf_counter()
            assert client.post("/api/v1/operations", body(i), format="json").status_code == expect
            seconds.append(time.perf_counter() - started)
    return Figures(statistics.median(seconds) * 1000, len(queries.captured_queries) / count,
                   commits.call_count / count)


if __name__ == "__main__":
    main()
