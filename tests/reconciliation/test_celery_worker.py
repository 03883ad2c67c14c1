"""A real `celery -A config worker -B` process against Redis and RabbitMQ, on the test database.

No test code calls the reconciler here: beat (embedded in the worker) schedules the sweeps and
the worker runs them. Both processes must see one database, so the tests are transactional
(committed rows) and the worker is started with DATABASE_URL pointing at this run's test
database — the file-based SQLite test database, or the PostgreSQL test database.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from config.celery import app as celery_app
from ledger.models import Operation
from reconciliation.models import Case, Evidence
from sandbox.testing import stop_process
from tests.conftest import submit_body
from tests.reconciliation.helpers import REFUND_OP, unknown_refund

PROJECT_ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("LEDGER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("LEDGER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
BROKERS = {"redis": REDIS_URL, "rabbitmq": AMQP_URL}
S = Operation.Status

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]


def broker_problem(url: str) -> str | None:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return f"broker {url.split('@')[-1]} is unreachable ({type(exc).__name__})"
    return None


def test_database_url() -> str:
    """DATABASE_URL for another process that must use exactly this test run's database."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(db["NAME"])
        assert name.startswith("/") and "memory" not in name, "needs a file-based test database"
        return f"sqlite://{name}"
    auth = quote(str(db["USER"]), safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(str(db["PASSWORD"]), safe="")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


test_database_url.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


class Worker:
    def __init__(self, process: subprocess.Popen[bytes], log_path: Path, queue: str,
                 broker_url: str) -> None:
        self.process = process
        self.log_path = log_path
        self.queue = queue
        self.broker_url = broker_url

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(params=sorted(BROKERS))
def broker_url(request: pytest.FixtureRequest) -> str:
    url = BROKERS[request.param]
    problem = broker_problem(url)
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}: CI must run the real-worker tests")  # never a silent skip
        pytest.skip(f"{problem}; set LEDGER_TEST_REDIS_URL / LEDGER_TEST_AMQP_URL")
    return url


@pytest.fixture
def worker(transactional_db, sandbox_server, tmp_path, broker_url) -> Iterator[Worker]:
    # A queue of our own: other workers on this Redis never take our tasks, nor we theirs.
    queue = f"agent-ledger-test-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": test_database_url(),
        "CELERY_BROKER_URL": broker_url,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "SANDBOX_URL": sandbox_server.url,
        "LEDGER_PROVIDER_TIMEOUT_SECONDS": "1",
        "LEDGER_SWEEP_INTERVAL_SECONDS": "0.5",
        "LEDGER_VAR_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-B",
             "-s", str(tmp_path / "celerybeat-schedule"), "-Q", queue, "-n", f"{queue}@%h",
             "--concurrency", "2", "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )
    handle = Worker(process, log_path, queue, broker_url)
    try:
        wait_for(lambda: " ready." in handle.log(), timeout=30,
                 message=lambda: f"worker did not start:\n{handle.log()}")
        yield handle
    finally:
        stop_process(process, timeout=15)
        _forget_queue(broker_url, queue)


def _forget_queue(broker_url: str, queue: str) -> None:
    if broker_url.startswith("amqp"):
        from kombu import Connection

        with Connection(broker_url) as conn:
            conn.default_channel.queue_delete(queue)
        return
    import redis

    client = redis.Redis.from_url(broker_url)
    for key in client.scan_iter(f"*{queue}*"):  # the queue and kombu's bindings for it
        client.delete(key)
    for key in client.scan_iter("_kombu.binding.*"):
        for member in client.smembers(key):
            if queue.encode() in member:
                client.srem(key, member)


def wait_for(condition: Callable[[], bool], *, timeout: float,
             message: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(message())


@contextlib.contextmanager
def producing_to(broker_url: str, queue: str) -> Iterator[None]:
    """Point this process's Celery producer at the worker's broker and queue for a while."""
    conf = celery_app.conf
    saved = (conf.broker_url, conf.task_default_queue, conf.broker_transport_options)
    conf.broker_url, conf.task_default_queue, conf.broker_transport_options = (
        broker_url, queue, {})
    celery_app._after_fork()  # drop pooled connections to the old broker
    try:
        yield
    finally:
        conf.broker_url, conf.task_default_queue, conf.broker_transport_options = saved
        celery_app._after_fork()


def status_of(operation_id: str) -> str:
    return Operation.objects.get(operation_id=operation_id).status


def test_beat_driven_sweeps_resolve_a_lost_response_and_a_dead_worker(
    worker, agent, sandbox
):
    from ledger import executor
    from ledger import transitions as ledger_transitions
    from tests.conftest import adapter_named, refund_params

    lost = unknown_refund(agent, "lose-response")
    # A worker that sent, then died before writing the answer; its lease runs out in 1 s.
    dead_id = "wf-82:invoice-18:refund-1:v1"
    prepared = executor.submit(agent=agent, operation_id=dead_id, tool_name="refund",
                               params=refund_params(invoice="invoice-18"),
                               execute=False).operation
    claim = ledger_transitions.operation_claim(prepared, worker="doomed", lease_seconds=1)
    adapter_named("sandbox").send(claim.operation, key=claim.operation.idempotency_key,
                                timeout=1.0)

    wait_for(lambda: status_of(REFUND_OP) == status_of(dead_id) == S.SUCCEEDED, timeout=30,
             message=lambda: f"not reconciled:\n{worker.log()[-4000:]}")

    for operation_id, open_reason in [(REFUND_OP, "connection_reset"),
                                      (dead_id, "lease_expired")]:
        case = Case.objects.get(operation__operation_id=operation_id)
        assert (case.state, case.open_reason, case.resolved_by) == (
            Case.State.RESOLVED, open_reason, "reconciler")
        assert Evidence.objects.filter(case=case, kind="resend", outcome="confirmed").exists()
    assert Operation.objects.get(pk=lost.pk).attempts == 2
    assert sandbox.effect_counts() == {REFUND_OP: 1, dead_id: 1}
    log = worker.log()
    assert "reconciliation.tasks.sweep_leases" in log and "reconciliation.tasks.sweep_cases" in log


def test_async_submission_is_sent_by_the_worker_and_reconciled_there_too(
    worker, api, sandbox
):
    plain = submit_body("wf-83:invoice-19:refund-1:v1", execution="async")
    lossy = submit_body("wf-84:invoice-20:refund-1:v1", execution="async")
    lossy["params"] = {**lossy["params"], "memo": "sandbox:lose-response"}

    with producing_to(worker.broker_url, worker.queue):
        responses = [api.post("/api/v1/operations", body, format="json")
                     for body in (plain, lossy)]

    for response in responses:
        assert response.status_code == 202, response.content
        assert response.json()["status"] == S.PREPARED  # answered before anything was sent
    ids = [plain["operation_id"], lossy["operation_id"]]
    wait_for(lambda: {status_of(i) for i in ids} == {S.SUCCEEDED}, timeout=30,
             message=lambda: f"not executed:\n{worker.log()[-4000:]}")
    assert not Case.objects.filter(operation__operation_id=ids[0]).exists()
    case = Case.objects.get(operation__operation_id=ids[1])
    assert case.state == Case.State.RESOLVED and case.resolved_by == "reconciler"
    assert sandbox.effect_counts() == {ids[0]: 1, ids[1]: 1}
    assert "ledger.tasks.execute_operation" in worker.log()
