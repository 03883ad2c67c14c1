"""Metrics summed over real processes (prometheus_client multiprocess mode), the metrics token,
and readiness: database, broker, and sweeps within three intervals."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from config.celery import app
from ops.models import SweepHeartbeat
from reconciliation import health

ROOT = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent("""
    import os, sys
    import django
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from ledger import metrics
    metrics.REPLAYS.labels("refund").inc(int(sys.argv[1]))
    metrics.OPERATIONS.labels("refund", "succeeded").inc()
    print(os.getpid())
""")


def run_writer(metrics_dir: Path, count: int, tmp_path: Path) -> int:
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                        "LEDGER_VAR_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", WRITER, str(count)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout.strip())


def test_metrics_sum_what_two_processes_wrote(client, db, settings, tmp_path):
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    pids = {run_writer(metrics_dir, 3, tmp_path), run_writer(metrics_dir, 4, tmp_path)}
    assert len(pids) == 2
    assert len(list(metrics_dir.glob("counter_*.db"))) == 2  # one file per process
    settings.PROMETHEUS_MULTIPROC_DIR = str(metrics_dir)

    body = client.get("/metrics").content.decode()

    assert 'ledger_replays_total{tool="refund"} 7.0' in body
    assert 'ledger_operations_total{outcome="succeeded",tool="refund"} 2.0' in body


def test_metrics_need_the_token_when_one_is_set(client, db, settings):
    settings.LEDGER_METRICS_TOKEN = "s3cret-metrics-token"

    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert ok.status_code == 200 and b"ledger_replays_total" in ok.content


def test_metrics_are_open_without_a_token(client, db, settings):
    settings.LEDGER_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200


def fresh_sweeps(at=None):
    for sweep in health.SWEEPS:
        health.record_sweep_finished(sweep, at=at)


def test_ready_when_database_broker_and_sweeps_are_fine(client, db):
    fresh_sweeps()
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ready" and body["database"] == "ok" and body["broker"] == "ok"
    assert set(body["sweeps"]) == {"leases", "cases", "unsent"}


def test_not_ready_when_a_sweep_is_older_than_three_intervals(client, db, settings, frozen):
    settings.LEDGER_SWEEP_INTERVAL_SECONDS = 5.0
    fresh_sweeps()
    frozen.shift(14)
    assert client.get("/readyz").status_code == 200
    health.record_sweep_finished("leases")
    health.record_sweep_finished("unsent")
    frozen.shift(2)  # "cases" last finished 16 s ago: more than 3 × 5 s

    response = client.get("/readyz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["sweeps"]["cases"]["ok"] is False and body["sweeps"]["leases"]["ok"] is True


def test_not_ready_when_no_sweep_has_ever_run(client, db):
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["sweeps"]["leases"] == {"last_finished_at": None, "ok": False}


def test_not_ready_when_the_broker_is_unreachable(client, db, monkeypatch):
    import socket

    fresh_sweeps()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(app.conf, "broker_url", f"redis://127.0.0.1:{port}/0")

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["broker"] == "unreachable"


def test_the_sweep_tasks_record_when_they_finished(db, settings):
    from ledger.tasks import retry_unsent_operations
    from reconciliation.tasks import sweep_cases, sweep_leases

    for task in (sweep_leases, sweep_cases, retry_unsent_operations):
        task.apply()  # through Celery's tracer, which sends task_success

    finished = health.last_sweep_finished_at()
    assert set(finished) == {"leases", "cases", "unsent"}
    assert all(when is not None and timezone.now() - when < dt.timedelta(minutes=1)
               for when in finished.values())


def test_the_sweep_gauge_reports_each_sweeps_last_finish(client, db):
    at = timezone.now().replace(microsecond=0)
    health.record_sweep_finished("cases", at=at)
    body = client.get("/metrics").content.decode()
    # prometheus_client writes floats Go-style ("1.7960449e+09" when the seconds end in
    # zeros), so compare the number, not its spelling.
    sample = re.search(r'^ledger_sweep_last_finished_timestamp_seconds\{sweep="cases"\} (\S+)$',
                       body, re.MULTILINE)
    assert sample is not None
    assert float(sample.group(1)) == at.timestamp()
    assert SweepHeartbeat.objects.count() == 1


@pytest.mark.parametrize("sweep", ["leases", "cases"])
def test_the_reconcile_command_records_its_sweeps(db, sweep):
    from io import StringIO

    from django.core.management import call_command

    call_command("reconcile", stdout=StringIO())
    assert health.last_sweep_finished_at(sweep)[sweep] is not None


READYZ = textwrap.dedent("""
    import json, os
    import django
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.test import Client
    response = Client(raise_request_exception=False).get("/readyz")
    print(json.dumps({"status": response.status_code, "body": response.json()}))
""")


def test_not_ready_when_the_database_is_unreachable(tmp_path):
    """A real process whose database does not answer (nothing listens on port 1)."""
    env = os.environ | {"DATABASE_URL": "postgres://postgres@127.0.0.1:1/agent_ledger",
                        "LEDGER_VAR_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", READYZ], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"status": 503,
                      "body": {"status": "unavailable", "database": "unreachable"}}


LIVE_GAUGE_WRITER = textwrap.dedent("""
    import os
    from prometheus_client import Gauge
    Gauge("ledger_test_live", "a live gauge", multiprocess_mode="livesum").set(5)
    print(os.getpid())
""")


@pytest.fixture
def dead_process_gauge(tmp_path: Path, monkeypatch: Any) -> tuple[int, Path]:
    """A live gauge's file written by a process that has exited, in this process's
    PROMETHEUS_MULTIPROC_DIR: (its pid, its file)."""
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    done = subprocess.run([sys.executable, "-c", LIVE_GAUGE_WRITER], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    pid = int(done.stdout.strip())
    files = list(metrics_dir.glob(f"gauge_live*_{pid}.db"))
    assert len(files) == 1
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    return pid, files[0]


def test_gunicorn_drops_a_dead_workers_live_gauges(dead_process_gauge):
    import runpy
    from types import SimpleNamespace

    pid, gauge_file = dead_process_gauge
    conf = runpy.run_path(str(ROOT / "deploy" / "gunicorn.conf.py"))

    conf["child_exit"](SimpleNamespace(pid=os.getpid()), SimpleNamespace(pid=pid))

    assert not gauge_file.exists()


def test_celery_drops_a_finished_pool_processs_live_gauges(dead_process_gauge):
    from celery import signals

    pid, gauge_file = dead_process_gauge

    signals.worker_process_shutdown.send(sender=None, pid=pid, exitcode=0)

    assert not gauge_file.exists()


def test_a_new_granian_worker_drops_dead_workers_live_gauges_and_keeps_the_living(
        dead_process_gauge):
    """granian has no child_exit hook: each worker, as it starts (which is also when a dead one
    is replaced), forgets the live gauges of processes that no longer run."""
    from config.processes import forget_dead_processes

    pid, gauge_file = dead_process_gauge
    own = gauge_file.with_name(gauge_file.name.replace(f"_{pid}.db", f"_{os.getpid()}.db"))
    shutil.copy(gauge_file, own)  # this (running) process's own gauges stay

    assert forget_dead_processes(gauge_file.parent) == [pid]

    assert not gauge_file.exists() and own.exists()
    assert forget_dead_processes(gauge_file.parent) == []  # nothing left to forget
