"""The operators' dashboard at 10,000 and at 1,000,000 operations: wall time of the overview
(three periods), the explorer (first page, a deep page, searches, filters) and one operation's
page, and one rollup of a closed minute, on a throwaway PostgreSQL database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/agent_ledger \\
        .venv/bin/python bench/ops_scale.py [--small 10000] [--large 1000000]

Rows are bulk-inserted with INSERT … SELECT FROM generate_series (not through the transitions:
what is measured here is reading them): terminal operations spread over 30 days with three
events each, and the same fixed set of unresolved ones (prepared, in flight, unknown with their
cases, some awaiting review) at both sizes — a healthy ledger's unresolved rows do not grow with
its history. The rollup counters are filled by running the real rollup over the last day.

The small database is copied (CREATE DATABASE … TEMPLATE) and the copy grown to the large
size; then every view is requested alternately on the two, eleven times each, so whatever else
the machine is doing slows both sides alike. Prints the medians and the ratio large/small (the
goal is ≤ 1.5: the pages read indexes and counters, never the whole table).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
UNRESOLVED = {"prepared": 40, "in_flight": 40, "unknown": 300}
SAMPLES = 11


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    args = parser.parse_args()
    sys.path.insert(0, str(PROJECT_ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LEDGER_VAR_DIR", tempfile.mkdtemp(prefix="agent-ledger-ops-"))
    os.environ["LEDGER_TEST_DB_SUFFIX"] = f"ops_{os.getpid()}"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        print("set DATABASE_URL=postgres://… (this benchmark bulk-loads with generate_series)")
        return 2
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    small_db = str(connection.settings_dict["NAME"])
    extra: list[str] = []
    try:
        extra = run(args.small, args.large)
    finally:
        connection.close()
        connection.settings_dict["NAME"] = small_db
        for name in extra or [f"{small_db}_large"]:
            use("postgres")
            with connection.cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
            connection.close()
        connection.settings_dict["NAME"] = small_db
        connection.creation.destroy_test_db(small_db, verbosity=0)
    return 0


def sql(statement: str, params: list[Any] | None = None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])


def seed_terminal(agent_id: int, first: int, last: int, total: int) -> None:
    """Terminal operations first..last (inclusive), created evenly over the last 30 days (row
    `total` is the newest), each with its three events."""
    started = time.perf_counter()
    sql(f"""
        INSERT INTO ledger_operation (
            operation_id, agent_id, run_id, tool_call_ids, tool, tool_version, provider,
            intent_params, params, params_hash, status, attempts, fencing_token, lease_owner,
            lease_expires_at, idempotency_key, key_first_sent_at, provider_request_id, result,
            error_class, value_amount, value_currency, subject, customer_ref, status_token,
            created_at, updated_at, sent_at, resolved_at, namespace_id, execution)
        SELECT 'wf-' || g || ':invoice-' || g || ':refund-1:v1', {agent_id}, 'run-' || (g / 5),
            '[]'::jsonb, CASE WHEN mod(g, 3) = 0 THEN 'send_email' ELSE 'refund' END, 1,
            CASE WHEN mod(g, 7) = 0 THEN 'stripe-sandbox' ELSE 'sandbox' END,
            jsonb_build_object('invoice', 'invoice-' || g), '{{}}'::jsonb,
            'sha256:' || md5(g::text), CASE WHEN mod(g, 50) = 0 THEN 'failed' ELSE 'succeeded' END,
            1, 1, '', NULL, 'key-' || g, t, 'eff_' || g, '{{}}'::jsonb,
            CASE WHEN mod(g, 50) = 0 THEN 'http_402.rejected' ELSE '' END,
            2500 + mod(g, 1000), 'EUR',
            'invoice-' || g, 'CUST-' || g, md5('token' || g), t, t, t, t,
            (SELECT namespace_id FROM ledger_agentcredential WHERE id = {agent_id}), 'server'
        FROM (SELECT g, now() - ((%s - g) * interval '30 days' / %s) AS t
              FROM generate_series(%s, %s) AS g) AS rows
    """, [total, total, first, last])
    sql("""
        INSERT INTO ledger_operationevent (operation_id, from_status, to_status, actor,
                                           fencing_token, reason, data, created_at)
        SELECT o.id, e.from_status, COALESCE(e.to_status, o.status), e.actor, e.token, e.reason,
               '{}'::jsonb, o.created_at + e.offset_ms * interval '1 millisecond'
        FROM ledger_operation o
        CROSS JOIN (VALUES ('', 'prepared', 'agent:bench', 0, 'intent_recorded', 0),
                           ('prepared', 'in_flight', 'worker:bench', 1, 'claimed_for_send', 1),
                           ('in_flight', NULL, 'worker:bench', 1, 'provider_confirmed', 120))
             AS e(from_status, to_status, actor, token, reason, offset_ms)
        WHERE o.id BETWEEN (SELECT min(id) FROM ledger_operation WHERE operation_id = %s)
                       AND (SELECT max(id) FROM ledger_operation)
    """, [f"wf-{first}:invoice-{first}:refund-1:v1"])
    print(f"  seeded operations {first:,}–{last:,} with events in "
          f"{time.perf_counter() - started:.1f} s")


def seed_unresolved(agent_id: int) -> None:
    """The same unresolved operations at both sizes; unknown ones have cases, a third of them
    awaiting review (some overdue), and some keys near the provider's retention."""
    start = 900_000_000
    for status, count in UNRESOLVED.items():
        sql(f"""
            INSERT INTO ledger_operation (
                operation_id, agent_id, run_id, tool_call_ids, tool, tool_version, provider,
                intent_params, params, params_hash, status, attempts, fencing_token,
                lease_owner, lease_expires_at, idempotency_key, key_first_sent_at,
                provider_request_id, result, error_class, value_amount, value_currency,
                subject, customer_ref, status_token, created_at, updated_at, sent_at,
                resolved_at, namespace_id, execution)
            SELECT 'wf-open-' || g || ':invoice-' || g || ':refund-1:v1', {agent_id},
                'run-open', '[]'::jsonb, 'refund', 1, 'sandbox', '{{}}'::jsonb, '{{}}'::jsonb,
                'sha256:' || md5(g::text), %s, 1, 1, '',
                CASE WHEN %s = 'in_flight' THEN now() + (mod(g, 3) - 1) * interval '1 minute' END,
                'key-open-' || g,
                CASE WHEN %s = 'prepared' THEN NULL
                     ELSE now() - (mod(g, 30)) * interval '1 hour' END,
                '', NULL, '', 2500, 'EUR', 'invoice-open-' || g, '', md5('open' || g),
                now() - mod(g, 30) * interval '1 hour',
                now() - mod(g, 40) * interval '1 minute',
                now(), NULL,
                (SELECT namespace_id FROM ledger_agentcredential WHERE id = {agent_id}), 'server'
            FROM generate_series(%s, %s) AS g
        """, [status, status, status, start, start + count - 1])
        start += count
    sql("""
        INSERT INTO reconciliation_case (
            operation_id, state, open_reason, review_reason, attempts, next_check_at,
            last_checked_at, deadline_at, strategies_tried, resolution, resolved_by,
            resolved_at, flagged, review_deadline_at, value_amount, claimed_by_id,
            claim_expires_at, created_at, updated_at)
        SELECT id, CASE WHEN mod(id, 3) = 0 THEN 'awaiting_review' ELSE 'checking' END,
            'timeout_after_send', CASE WHEN mod(id, 3) = 0 THEN 'high_value' ELSE '' END, 1,
            CASE WHEN mod(id, 3) = 0 THEN NULL ELSE now() + interval '1 minute' END, NULL,
            now() + interval '4 hours', '[]'::jsonb, '', '', NULL, false,
            CASE WHEN mod(id, 3) = 0 THEN now() + (mod(id, 5) - 1) * interval '1 hour' END,
            value_amount, NULL, NULL, created_at, updated_at
        FROM ledger_operation WHERE status = 'unknown'
    """)


def analyze() -> None:
    for table in ("ledger_operation", "ledger_operationevent", "reconciliation_case",
                  "ops_stat"):
        sql(f"VACUUM ANALYZE {table}")


def use(database: str) -> None:
    """Point the default connection at one of the two databases (connect outside the timing)."""
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = database
    connection.ensure_connection()


def views() -> dict[str, str]:
    """The URLs measured; built on the large database, where every row they name exists in
    the small one too (IDs 1–10,000 and the unresolved rows are in both)."""
    from ledger.models import Operation
    from ops.explorer import encode_cursor

    small_rows = Operation.objects.filter(operation_id__startswith="wf-").exclude(
        operation_id__startswith="wf-open").order_by("-created_at", "-pk")
    deep = small_rows.filter(pk__lte=8_000).first()
    one = Operation.objects.filter(status="unknown").order_by("pk").first()
    assert deep is not None and one is not None
    return {
        "overview, last hour": "/ops/?period=hour",
        "overview, last day": "/ops/?period=day",
        "overview, 30 days": "/ops/?period=month",
        "explorer, first page": "/ops/operations/",
        "explorer, deep page": f"/ops/operations/?after={encode_cursor(deep)}",
        "explorer, search op ID": "/ops/operations/?q=wf-9500:invoice-9500:refund-1:v1",
        "explorer, search prefix": "/ops/operations/?q=wf-1234",
        "explorer, search subject": "/ops/operations/?q=invoice-777",
        "explorer, status=unknown": "/ops/operations/?status=unknown",
        "explorer, tool+provider": "/ops/operations/?tool=refund&provider=sandbox",
        "explorer, problem=past_sla": "/ops/operations/?problem=past_sla",
        "explorer, last 2 days": "/ops/operations/?since=" + time.strftime(
            "%Y-%m-%dT%H:%M", time.gmtime(time.time() - 2 * 86400)),
        "operation page": f"/ops/operations/{one.pk}/",
    }


def measure(small_db: str, large_db: str, session_key: str) -> dict[str, tuple[float, float]]:
    """Each view alternately on the small and the large database, SAMPLES times each, so
    whatever else the machine is doing slows both sides alike; medians in ms."""
    from django.conf import settings
    from django.test import Client

    from ops import rollup

    client = Client()
    client.cookies.load({settings.SESSION_COOKIE_NAME: session_key})
    use(large_db)
    urls = views()
    results = {}
    for name, url in urls.items():
        samples: dict[str, list[float]] = {small_db: [], large_db: []}
        for _ in range(SAMPLES):
            for database in (small_db, large_db):
                use(database)
                assert client.get(url).status_code == 200, url  # warm, and checked
                begun = time.perf_counter()
                client.get(url)
                samples[database].append(time.perf_counter() - begun)
        results[name] = (statistics.median(samples[small_db]) * 1000,
                         statistics.median(samples[large_db]) * 1000)
    minute: dict[str, list[float]] = {small_db: [], large_db: []}
    for _ in range(SAMPLES):
        for database in (small_db, large_db):
            use(database)
            begun = time.perf_counter()
            _one_minute_rollup(rollup)()
            minute[database].append(time.perf_counter() - begun)
    results["rollup of one minute"] = (statistics.median(minute[small_db]) * 1000,
                                       statistics.median(minute[large_db]) * 1000)
    return results


def _one_minute_rollup(rollup: Any) -> Any:
    import datetime as dt

    from django.utils import timezone

    from ops.models import RollupCursor

    def run() -> None:
        minute = rollup.floor_to(timezone.now() - dt.timedelta(minutes=3), "minute")
        RollupCursor.objects.update_or_create(name="events",
                                              defaults={"rolled_until": minute})
        report = rollup.rollup(now=minute + dt.timedelta(minutes=1, seconds=31))
        assert report.rolled_until == minute + dt.timedelta(minutes=1)

    return run


def run(small: int, large: int) -> list[str]:
    """Seed the small database, copy it (CREATE DATABASE … TEMPLATE) and grow the copy to the
    large size; returns the copy's name for the caller to drop."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, get_user_model
    from django.contrib.auth import SESSION_KEY as USER_KEY
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import connection

    from ledger.auth import agent_create
    from ops import rollup

    agent, _ = agent_create(name="bench-ops", tools=["refund", "send_email"])
    user = get_user_model().objects.create_user("bench-ops", is_staff=True)
    store = SessionStore()
    store.update({USER_KEY: str(user.pk),
                  BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
                  HASH_SESSION_KEY: user.get_session_auth_hash()})
    store.save()  # copied with the database, so the same cookie signs in to both
    print(f"seeding {small:,} operations")
    seed_unresolved(agent.pk)
    seed_terminal(agent.pk, 1, small, small)
    rollup.rollup_until_current(max_runs=8)
    analyze()
    small_db = str(connection.settings_dict["NAME"])
    large_db = f"{small_db}_large"
    connection.close()
    use("postgres")
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{large_db}"')
        cursor.execute(f'CREATE DATABASE "{large_db}" TEMPLATE "{small_db}"')
    use(large_db)
    print(f"copied; growing the copy to {large:,} operations")
    seed_terminal(agent.pk, small + 1, large, large)
    analyze()
    results = measure(small_db, large_db, str(store.session_key))
    print(f"\n{'view':30} {small:>10,} ops {large:>10,} ops   ratio")
    for name, (at_small, at_large) in results.items():
        print(f"{name:30} {at_small:10.1f} ms {at_large:10.1f} ms   {at_large / at_small:5.2f}")
    total_small = sum(a for a, _ in results.values())
    total_large = sum(b for _, b in results.values())
    print(f"{'all views together':30} {total_small:10.1f} ms {total_large:10.1f} ms   "
          f"{total_large / total_small:5.2f}")
    use(small_db)
    return [large_db]


if __name__ == "__main__":
    sys.exit(main())
