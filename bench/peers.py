"""The ledger against its peers, side by side, interleaved in rounds (issue 10).

    .venv/bin/python bench/peers.py [--rounds 5] [--ops 500] [--http-ops 1600]

One command. It creates bench/.venv-peers (dbos 3.4 and psycopg, never the service's
environment) on first use, two throwaway PostgreSQL databases on the server of DATABASE_URL
(default postgres://postgres@127.0.0.1:5432/…), a sandbox provider process and the web server
twice — granian with deploy/web.py (recommended) and gunicorn with deploy/gunicorn.conf.py (the
supported alternative) — warms each web server up (--warmup N fresh and replay actions from 16
clients, unrecorded: threads started, database and provider connections open, as on a server
that has been up for a minute) and each in-process peer likewise, then runs in every round, one
after the other:

- raw psycopg doing the ledger's statements (the lookup, the insert already claimed with its
  events, the fenced outcome with its event; a replay is the lookup), 1 and 8 threads;
- DBOS 3.4 in its own process and venv: a workflow with one no-op step, and a replay of a
  completed workflow ID, 1 and 8 threads;
- the ledger in this process (executor.submit) with an instant provider adapter, fresh and
  replay, 1 and 8 threads;
- the ledger through HTTP (granian, then gunicorn) with the sandbox over HTTP as the
  provider, fresh and replay, 1 and 16 clients (keep-alive HTTP/1.1 clients on raw sockets:
  KeepAliveConnection).

It prints ops/s (median over rounds), p50 and p99 latency (all rounds pooled), CPU per action
(this process, the web servers' workers, the DBOS peer and the PostgreSQL backends of the
benchmark's databases, from /proc — the provider excluded; unlike ops/s it barely depends on
how busy the machine is), statements per action (libpq protocol trace in this process;
SQLAlchemy's cursor events inside the DBOS peer; through HTTP, PostgreSQL transactions per
action from pg_stat_database, which for the ledger is the same number as every statement is its
own autocommit transaction), WAL bytes per action
(pg_current_wal_lsn before and after each run; cluster-wide, so other users of the server add
to it: the smallest round is shown), and the ratios issue 10 asks for, each computed within a
round and reported as the median over rounds. Only ratios are meaningful on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / "bench" / ".venv-peers"
PEERS_REQUIREMENTS = ["dbos==3.4.*", "psycopg[binary]==3.3.*"]
sys.path.insert(0, str(ROOT))


# --- environment ---------------------------------------------------------------------------

def ensure_peers_venv() -> Path:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {PEERS_VENV.relative_to(ROOT)} ({', '.join(PEERS_REQUIREMENTS)})")
        base = shutil.which("python3") or sys.executable
        subprocess.run([base, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEERS_REQUIREMENTS],
                       check=True)
    return python


def server_url(database: str) -> str:
    base = os.environ.get("DATABASE_URL", "") or "postgres://postgres@127.0.0.1:5432/agent_ledger"
    parsed = urlparse(base)
    if parsed.scheme not in {"postgres", "postgresql"}:
        sys.exit("bench/peers.py needs PostgreSQL (DATABASE_URL=postgres://…)")
    return urlunparse(parsed._replace(path=f"/{database}", scheme="postgresql"))


def admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- measurement ---------------------------------------------------------------------------

@dataclass
class Run:
    latencies: list[float]
    wall: float
    wal_bytes: int = 0
    cpu_seconds: float = 0.0

    @property
    def ops_per_second(self) -> float:
        return len(self.latencies) / self.wall if self.wall else 0.0


@dataclass
class Scenario:
    name: str
    runs: list[Run] = field(default_factory=list)
    statements: float | None = None
    statements_how: str = ""

    def ops(self) -> float:
        return statistics.median(r.ops_per_second for r in self.runs)

    def pct(self, q: float) -> float:
        pooled = sorted(x for r in self.runs for x in r.latencies)
        return pooled[min(len(pooled) - 1, int(q * len(pooled)))] * 1000

    def wal(self) -> float:
        return min(r.wal_bytes / max(len(r.latencies), 1) for r in self.runs)

    def cpu_ms(self) -> float:
        return statistics.median(r.cpu_seconds / max(len(r.latencies), 1) for r in self.runs
                                 ) * 1000


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return pids


class CpuMeter:
    """CPU used by everything an action runs on except the provider: this process (the
    in-process peers, and the HTTP clients), the web servers' workers, the DBOS peer and the
    PostgreSQL backends serving the benchmark's databases. Unlike ops/s it hardly depends on
    how busy the machine is."""

    def __init__(self, monitor: Any, dbs: Sequence[str]) -> None:
        self.monitor, self.dbs = monitor, list(dbs)
        self.groups: list[int] = []
        self.pids: list[int] = []

    def _pids(self) -> set[int]:
        with self.monitor.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s) "
                           "AND pid <> pg_backend_pid()", [self.dbs])
            backends = {int(row[0]) for row in cursor.fetchall()}
        return backends | set(self.pids) | {p for g in self.groups for p in _group(g)}

    def snapshot(self) -> dict[int, float]:
        cpu = {pid: _proc_cpu(pid) for pid in self._pids()}
        if not self.pids:
            cpu[0] = time.process_time()  # this process (the DBOS peer is another one)
        return cpu

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        return sum(value - before.get(pid, 0.0) for pid, value in after.items())


def wal_lsn(cursor: Any) -> int:
    cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return int(cursor.fetchone()[0])


def in_threads(threads: int, items: Sequence[Any], action: Callable[[Any, Any], None],
               setup: Callable[[], Any], teardown: Callable[[Any], None]) -> Run:
    """Run action(state, item) over items from `threads` threads, each with its own state
    (connection) made before the clock starts."""
    chunks = [items[i::threads] for i in range(threads)]
    latencies: list[list[float]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        state = setup()
        try:
            barrier.wait()
            for item in chunks[n]:
                started = time.perf_counter()
                action(state, item)
                latencies[n].append(time.perf_counter() - started)
        except BaseException as exc:  # reported after the run
            errors.append(exc)
        finally:
            teardown(state)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in pool:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return Run([x for chunk in latencies for x in chunk], wall)


# --- raw psycopg: the ledger's statements, by hand -----------------------------------------

RAW_INSERT = """
WITH ins AS (
  INSERT INTO ledger_operation (operation_id, namespace_id, agent_id, run_id, tool_call_ids, tool,
    tool_version, provider, intent_params, params, params_hash, status, attempts, fencing_token,
    lease_owner, lease_expires_at, idempotency_key, key_first_sent_at, provider_request_id,
    result, error_class, value_amount, value_currency, subject, customer_ref, status_token,
    execution, created_at, updated_at, sent_at, resolved_at)
  VALUES (%(op)s, %(ns)s, %(agent)s, '', '[]', 'refund', 1, 'instant', %(intent)s, %(intent)s,
    %(hash)s, 'in_flight', 1, 1, 'raw', now() + interval '60 seconds', %(key)s, now(), '',
    NULL, '', %(amount)s, 'EUR', %(subject)s, '', %(token)s, 'server', now(), now(), now(),
    NULL)
  ON CONFLICT (namespace_id, operation_id) DO NOTHING RETURNING id
), ev AS (
  INSERT INTO ledger_operationevent (operation_id, from_status, to_status, actor,
    fencing_token, reason, data, created_at)
  SELECT ins.id, v.f, v.t, v.a, v.k, v.r, '{}'::jsonb, now() FROM ins CROSS JOIN (VALUES
    (0, '', 'prepared', 'agent:raw', 0, 'intent_recorded'),
    (1, 'prepared', 'in_flight', 'worker:raw', 1, 'claimed_for_send')) AS v(n, f, t, a, k, r)
  ORDER BY v.n
) SELECT id FROM ins
"""

RAW_FINISH = """
WITH moved AS (
  UPDATE ledger_operation SET status = 'succeeded', updated_at = now(), result = %(result)s,
    provider_request_id = %(ref)s, error_class = '', resolved_at = now(), lease_owner = '',
    lease_expires_at = NULL
  WHERE id = %(id)s AND status = 'in_flight' AND fencing_token = 1 RETURNING id
), ev AS (
  INSERT INTO ledger_operationevent (operation_id, from_status, to_status, actor,
    fencing_token, reason, data, created_at)
  SELECT moved.id, 'in_flight', 'succeeded', 'worker:raw', 1, 'provider_confirmed',
    '{}'::jsonb, now() FROM moved
) SELECT id FROM moved
"""


def raw_sql() -> tuple[str, str, str]:
    from ledger.selectors import _lookup_sql

    return _lookup_sql()[0], RAW_INSERT, RAW_FINISH


class RawPeer:
    def __init__(self, dsn: str, agent_id: int, namespace_id: int) -> None:
        self.dsn, self.agent_id, self.namespace_id = dsn, agent_id, namespace_id
        self.lookup, self.insert, self.finish = raw_sql()

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def fresh(self, conn: Any, item: tuple[str, int]) -> None:
        import hashlib

        from psycopg.types.json import Jsonb

        op = item[0]
        if conn.execute(self.lookup, [self.namespace_id, op]).fetchone() is not None:
            raise AssertionError("fresh ID exists")
        digest = hashlib.sha256(op.encode()).hexdigest()
        row = conn.execute(self.insert, {
            "op": op, "ns": self.namespace_id, "agent": self.agent_id,
            "intent": Jsonb({"invoice": op, "amount": 100}),
            "hash": f"sha256:{digest}", "key": f"al_{digest[:40]}", "amount": 100,
            "subject": op[:200], "token": uuid.uuid4().hex}).fetchone()
        # the instant provider answers here
        conn.execute(self.finish, {"id": row[0], "result": Jsonb({"id": f"re_{digest[:12]}"}),
                                   "ref": f"re_{digest[:12]}"}).fetchone()

    def replay(self, conn: Any, item: tuple[str, int]) -> None:
        if conn.execute(self.lookup, [self.namespace_id, item[0]]).fetchone() is None:
            raise AssertionError("replay ID missing")


# --- the ledger in this process ------------------------------------------------------------

class InstantAdapter:
    """A provider that confirms at once: the ledger's own cost, without a provider's."""

    name = "instant"

    def __init__(self) -> None:
        from ledger.providers.base import Capabilities

        self.capabilities = Capabilities(
            honours_idempotency_keys=True, key_retention_seconds=86400,
            lookup_by_request_id=False, lookup_by_key=False, lookup_by_reference=False,
            lookup_consistency_seconds=0.0, authoritative_absence=False)

    def send(self, operation: Any, *, key: str, timeout: float) -> Any:
        from ledger.providers.base import Confirmed

        return Confirmed(result={"id": f"re_{key[3:15]}"}, provider_request_id=f"re_{key[3:15]}")

    def lookup(self, operation: Any, *, timeout: float) -> Any:
        raise NotImplementedError

    def lookup_query(self, operation: Any) -> dict[str, str]:
        return {}


def use_instant_refunds() -> None:
    """In this process the catalogue's refund tool sends through InstantAdapter (the web
    servers keep the real connector, pointed at the sandbox)."""
    import dataclasses

    from ledger import tools
    from ledger.catalogue import Catalogue

    current = tools.catalogue()
    instant = InstantAdapter()
    versions = {
        name: ({n: dataclasses.replace(tool, adapter=instant) for n, tool in by_version.items()}
               if name == "refund" else by_version)
        for name, by_version in current.versions.items()
    }
    tools._state = Catalogue(path=current.path, versions=versions)


def refund_params(i: int) -> dict[str, Any]:
    return {"invoice": f"inv-{i}", "amount": 100 + i % 1000, "currency": "EUR",
            "payee": "cus_bench"}


class LedgerPeer:
    def __init__(self, agent: Any) -> None:
        self.agent = agent

    @staticmethod
    def connect() -> None:
        from django.db import connection

        connection.ensure_connection()

    @staticmethod
    def close(_: Any) -> None:
        from django.db import connection

        connection.close()

    def _submit(self, item: tuple[str, int], expect: str) -> None:
        from ledger import executor

        op, i = item
        submission = executor.submit(agent=self.agent, operation_id=op, tool_name="refund",
                                     params=refund_params(i))
        if submission.disposition.value != expect:
            raise AssertionError(f"{op}: {submission.disposition} instead of {expect}")

    def fresh(self, _: Any, item: tuple[str, int]) -> None:
        self._submit(item, "created")

    def replay(self, _: Any, item: tuple[str, int]) -> None:
        self._submit(item, "replayed")


def traced_statements(action: Callable[[], None]) -> int:
    """Statements the server receives from this thread's Django connection during action()."""
    from django.db import connection
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as log:
        pgconn.trace(log.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            action()
        finally:
            pgconn.untrace()
        log.seek(0)
        return sum(1 for line in log
                   if line.split("\t")[:1] == ["F"] and len(line.split("\t")) > 2
                   and line.split("\t")[2] in {"Query", "Execute"})


def traced_raw(conn: Any, action: Callable[[], None]) -> int:
    from psycopg import pq

    with tempfile.TemporaryFile("w+") as log:
        conn.pgconn.trace(log.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            action()
        finally:
            conn.pgconn.untrace()
        log.seek(0)
        return sum(1 for line in log if len(line.split("\t")) > 2 and line.split("\t")[0] == "F"
                   and line.split("\t")[2] in {"Query", "Execute"})


# --- DBOS in its own venv and process --------------------------------------------------------

class DbosPeer:
    def __init__(self, python: Path, dsn: str) -> None:
        self.process = subprocess.Popen(
            [str(python), str(ROOT / "bench" / "peers_dbos.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PEERS_DBOS_URL": dsn, "PYTHONUNBUFFERED": "1"})
        assert json.loads(self._line())["ready"]

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the DBOS peer exited")
        return line

    def run(self, cmd: str, threads: int, ops: int) -> tuple[Run, dict[str, int]]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"cmd": cmd, "threads": threads, "ops": ops,
                                             "prefix": uuid.uuid4().hex}) + "\n")
        self.process.stdin.flush()
        out = json.loads(self._line())
        return Run(out["latencies"], out["wall"]), {"statements": out["statements"],
                                                    "commits": out["commits"]}

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write('{"cmd": "quit"}\n')
            self.process.stdin.flush()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


# --- the ledger over HTTP --------------------------------------------------------------------

class KeepAliveConnection:
    """One kept-alive HTTP/1.1 connection that sends prepared request bytes and reads the answer
    by its Content-Length: a load generator should cost as little as it can, and on a 2-core
    machine shared with the server every client millisecond is one the server does not get
    (http.client cost about 0.26 ms of CPU per request, this about a third of that)."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self.sock = socket.create_connection((host, port), timeout=30.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._fill()
        head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                       if line[:15].lower() == b"content-length:"), None)
        if length is None:
            raise AssertionError(f"answer without Content-Length: {head[:300]!r}")
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, body

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


class HttpPeer:
    """Keep-alive HTTP/1.1 clients (KeepAliveConnection), one per thread."""

    def __init__(self, base: str, token: str) -> None:
        parsed = urlparse(base)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.head = (f"POST /api/v1/operations HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                     f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                     f"Accept: */*\r\n")

    def connect(self) -> KeepAliveConnection:
        return KeepAliveConnection(self.host, self.port)

    @staticmethod
    def close(client: KeepAliveConnection) -> None:
        client.close()

    def _post(self, client: KeepAliveConnection, item: tuple[str, int], expect: int) -> None:
        op, i = item
        body = json.dumps({"operation_id": op, "tool": "refund",
                           "params": refund_params(i)}).encode()
        status, answer = client.exchange(
            f"{self.head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if status != expect:
            raise AssertionError(f"{op}: HTTP {status} {answer[:200]!r}")

    def fresh(self, client: KeepAliveConnection, item: tuple[str, int]) -> None:
        self._post(client, item, 201)

    def replay(self, client: KeepAliveConnection, item: tuple[str, int]) -> None:
        self._post(client, item, 200)


def start_server(server: str, env: dict[str, str], port: int, log: Path
                 ) -> subprocess.Popen[bytes]:
    """The production web server as documented: granian (deploy/web.py, recommended) or
    gunicorn (deploy/gunicorn.conf.py, the supported alternative)."""
    import httpx

    if server == "granian":
        command = [sys.executable, str(ROOT / "deploy" / "web.py")]
        env = {**env, "GRANIAN_PORT": str(port)}
    else:
        command = [str(Path(sys.executable).parent / "gunicorn"), "-c",
                   str(ROOT / "deploy" / "gunicorn.conf.py"), "config.wsgi"]
        env = {**env, "GUNICORN_BIND": f"127.0.0.1:{port}"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("ab"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"{server} did not start; see {log}")


def stop_group(process: subprocess.Popen[bytes]) -> None:
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def server_transactions(dbs: Sequence[str], run: Callable[[], int]) -> float:
    """PostgreSQL transactions committed in our databases per action, from pg_stat_database.
    Other backends flush their counters when idle within ~10 s, so this waits that out."""
    import psycopg

    def total() -> int:
        with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT sum(xact_commit) FROM pg_stat_database "
                               "WHERE datname = ANY(%s)", [list(dbs)]).fetchone()
            return int(row[0] or 0)

    # A web thread's database connection older than CONN_MAX_AGE is replaced by its next
    # request, and a new connection's set-up statements are transactions too: the caller has
    # just sent a burst from 16 clients (every thread reconnected if it had to), so none of
    # the connections serving `run` is old enough to be replaced while it is counted.
    time.sleep(11)
    before = total()
    actions = run()
    time.sleep(11)
    after = total()
    return (after - before - 2) / actions  # our two reads of the counter


# --- the run ---------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    # Runs long enough that a moment of the shared machine's noise is a small part of one (a
    # one-thread ledger run of 200 actions lasted 0.4 s).
    parser.add_argument("--ops", type=int, default=500, help="actions per in-process run")
    parser.add_argument("--http-ops", type=int, default=1600, help="actions per HTTP run")
    parser.add_argument("--warmup", type=int, default=400,
                        help="unrecorded fresh and replay actions each web server serves from "
                             "16 clients before the rounds, and (at most --ops of them) each "
                             "in-process peer runs with 1 and 8 threads (0: none)")
    parser.add_argument("--skip-server-counts", action="store_true",
                        help="skip the (slow, ~90 s) pg_stat_database transaction counts")
    args = parser.parse_args()

    peers_python = ensure_peers_venv()
    tag = f"{os.getpid()}_{int(time.time())}"
    ledger_db, dbos_db = f"bench_peers_{tag}", f"bench_peers_{tag}_dbos"
    admin(f'CREATE DATABASE "{ledger_db}"')
    admin(f'CREATE DATABASE "{dbos_db}"')
    workdir = Path(tempfile.mkdtemp(prefix="ledger-peers-"))
    env = {
        **os.environ,
        "DATABASE_URL": server_url(ledger_db).replace("postgresql://", "postgres://", 1),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LEDGER_VAR_DIR": str(workdir),
        "LEDGER_AGENT_RATE": "100000000/min",  # the benchmark measures the ledger, not the throttle
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    os.environ.update(env)
    dbos = sandbox = None
    servers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        import django

        django.setup()
        import logging

        logging.getLogger("httpx").setLevel(logging.WARNING)
        from django.core.management import call_command

        from ledger.auth import agent_create
        from sandbox.testing import SandboxServer

        call_command("migrate", verbosity=0)
        agent, token = agent_create(name=f"bench-{tag}", tools=["refund"])
        use_instant_refunds()

        sandbox = SandboxServer()
        sandbox.__enter__()
        https = {}
        for server in SERVERS:
            port = free_port()
            servers[server] = start_server(server, {**env, "SANDBOX_URL": sandbox.url}, port,
                                           workdir / f"{server}.log")
            https[server] = HttpPeer(f"http://127.0.0.1:{port}", token)
        dbos = DbosPeer(peers_python, server_url(dbos_db))
        raw = RawPeer(server_url(ledger_db), agent.pk, agent.namespace_id)
        ledger = LedgerPeer(agent)
        report = bench(args, raw, ledger, https, dbos, [ledger_db, dbos_db],
                       [p.pid for p in servers.values()])
        print(report)
    finally:
        if dbos is not None:
            dbos.close()
        for process in servers.values():
            stop_group(process)
        if sandbox is not None:
            sandbox.__exit__(None, None, None)
        from django.db import connections

        connections.close_all()
        for db in (ledger_db, dbos_db):
            admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(workdir, ignore_errors=True)


# The recommended server first: its rows are "ledger HTTP", the alternative's "gunicorn HTTP".
SERVERS = ("granian", "gunicorn")
HTTP_LABEL = {"granian": "ledger HTTP      ", "gunicorn": "gunicorn HTTP    "}


def bench(args: argparse.Namespace, raw: RawPeer, ledger: LedgerPeer,
          https: dict[str, HttpPeer], dbos: DbosPeer, dbs: list[str],
          server_pids: list[int]) -> str:
    import psycopg

    scenarios: dict[str, Scenario] = {}

    def scenario(name: str) -> Scenario:
        return scenarios.setdefault(name, Scenario(name))

    monitor = psycopg.connect(server_url(dbs[0]), autocommit=True)
    # The ledger's and raw psycopg's runs: this process, the web servers, the ledger database's
    # backends. DBOS's runs: its process and its database's backends (it polls in the
    # background while idle, which must not be charged to the others).
    meter = CpuMeter(monitor, dbs[:1])
    meter.groups = list(server_pids)
    dbos_meter = CpuMeter(monitor, dbs[1:])
    dbos_meter.pids = [dbos.process.pid]
    counter = [0]

    def ids(prefix: str, n: int) -> list[tuple[str, int]]:
        counter[0] += 1
        return [(f"bench:{prefix}{counter[0]}:refund-{i}:v1", i) for i in range(n)]

    def timed(name: str, threads: int, ops: Sequence[Any], action: Callable[[Any, Any], None],
              setup: Callable[[], Any], teardown: Callable[[Any], None]) -> None:
        with monitor.cursor() as cursor:
            cpu = meter.snapshot()
            before = wal_lsn(cursor)
            run = in_threads(threads, ops, action, setup, teardown)
            run.wal_bytes = wal_lsn(cursor) - before
            run.cpu_seconds = meter.used(cpu, meter.snapshot())
        scenario(name).runs.append(run)

    def close(conn: Any) -> None:
        conn.close()

    ratios: dict[str, list[float]] = {}

    # A production server has been up for more than a minute: its blocking threads are started,
    # each with its database connection and prepared statements, and its connections to the
    # provider are open. Round 1 would otherwise charge that start-up to its p99.
    for http in https.values() if args.warmup else ():
        ops = ids("warm", args.warmup)
        in_threads(16, ops, http.fresh, http.connect, http.close)
        in_threads(16, ops, http.replay, http.connect, http.close)
    # Likewise each in-process peer: its code paths run once, its process-wide caches filled
    # (the tool catalogue, each tool version recorded on first use, psycopg's adapters), so
    # round 1 does not charge them to whichever peer ran first.
    for threads in (1, 8) if args.warmup else ():
        n = min(args.warmup, args.ops)
        ops = ids("warmraw", n)
        in_threads(threads, ops, raw.fresh, raw.connect, close)
        in_threads(threads, ops, raw.replay, raw.connect, close)
        for cmd in ("fresh", "replay"):
            dbos.run(cmd, threads, n)
        ops = ids("warmled", n)
        in_threads(threads, ops, ledger.fresh, ledger.connect, ledger.close)
        in_threads(threads, ops, ledger.replay, ledger.connect, ledger.close)

    for round_no in range(1, args.rounds + 1):
        print(f"round {round_no}/{args.rounds}", file=sys.stderr, flush=True)
        for threads in (1, 8):
            ops = ids("raw", args.ops)
            timed(f"psycopg raw       fresh  {threads:>2}t", threads, ops,
                  raw.fresh, raw.connect, close)
            timed(f"psycopg raw       replay {threads:>2}t", threads, ops,
                  raw.replay, raw.connect, close)
            for cmd in ("fresh", "replay"):
                with monitor.cursor() as cursor:
                    before = wal_lsn(cursor)
                    cpu = dbos_meter.snapshot()
                    run, _ = dbos.run(cmd, threads, args.ops)
                    # both include a replay run's setup (completing the workflows first)
                    run.wal_bytes = wal_lsn(cursor) - before
                    run.cpu_seconds = dbos_meter.used(cpu, dbos_meter.snapshot())
                scenario(f"DBOS 3.4          {cmd:<6} {threads:>2}t").runs.append(run)
            ops = ids("led", args.ops)
            timed(f"ledger in process fresh  {threads:>2}t", threads, ops,
                  ledger.fresh, ledger.connect, ledger.close)
            timed(f"ledger in process replay {threads:>2}t", threads, ops,
                  ledger.replay, ledger.connect, ledger.close)
        for server, http in https.items():
            label = HTTP_LABEL[server]
            for clients in (1, 16):
                ops = ids("http", args.http_ops if clients > 1 else args.http_ops // 4)
                timed(f"{label} fresh  {clients:>2}c", clients, ops,
                      http.fresh, http.connect, http.close)
                timed(f"{label} replay {clients:>2}c", clients, ops,
                      http.replay, http.connect, http.close)

        def last(name: str) -> Run:
            return scenarios[name].runs[-1]

        for t in (1, 8):
            fresh = last(f"ledger in process fresh  {t:>2}t").ops_per_second
            ratios.setdefault(f"in process fresh {t}t: ledger / DBOS   (≥ 3)", []).append(
                fresh / last(f"DBOS 3.4          fresh  {t:>2}t").ops_per_second)
            ratios.setdefault(f"in process fresh {t}t: ledger / raw    (≥ 0.5)", []).append(
                fresh / last(f"psycopg raw       fresh  {t:>2}t").ops_per_second)
            ratios.setdefault(f"in process replay {t}t: ledger / raw   (≥ 0.5)", []).append(
                last(f"ledger in process replay {t:>2}t").ops_per_second
                / last(f"psycopg raw       replay {t:>2}t").ops_per_second)
        ratios.setdefault("HTTP fresh 16c / DBOS in process fresh 8t (> 1)", []).append(
            last("ledger HTTP       fresh  16c").ops_per_second
            / last("DBOS 3.4          fresh   8t").ops_per_second)
        ratios.setdefault("HTTP replay 16c: granian / gunicorn", []).append(
            last("ledger HTTP       replay 16c").ops_per_second
            / last("gunicorn HTTP     replay 16c").ops_per_second)

    # Statements per action.
    from django.db import connection

    sample = ids("count", 1)[0]
    fresh_n = traced_statements(lambda: ledger.fresh(None, sample))
    replay_n = traced_statements(lambda: ledger.replay(None, sample))
    for name, sc in scenarios.items():
        if name.startswith("ledger in process"):
            sc.statements = fresh_n if "fresh" in name else replay_n
            sc.statements_how = "libpq trace"
    connection.close()
    conn = raw.connect()
    sample = ids("count", 1)[0]
    fresh_n = traced_raw(conn, lambda: raw.fresh(conn, sample))
    replay_n = traced_raw(conn, lambda: raw.replay(conn, sample))
    conn.close()
    for name, sc in scenarios.items():
        if name.startswith("psycopg raw"):
            sc.statements, sc.statements_how = (fresh_n if "fresh" in name else replay_n,
                                                "libpq trace")
    for cmd in ("fresh", "replay"):
        _, counts = dbos.run(cmd, 1, 20)
        for name, sc in scenarios.items():
            if name.startswith("DBOS") and cmd in name:
                sc.statements = counts["statements"] / 20
                sc.statements_how = f"SQLAlchemy, {counts['commits'] / 20:.1f} commits"
    http = https[SERVERS[0]]
    if not args.skip_server_counts:
        for cmd in ("fresh", "replay"):
            ops = ids("xact", 50)
            in_threads(16, ids("xwarm", 64), http.fresh, http.connect, http.close)
            if cmd == "replay":
                in_threads(1, ops, http.fresh, http.connect, http.close)

            def run_http(ops: list[tuple[str, int]] = ops, cmd: str = cmd) -> int:
                in_threads(1, ops, getattr(http, cmd), http.connect, http.close)
                return len(ops)

            # The ledger's database only: DBOS's idle peer polls its own in the background.
            per_action = server_transactions(dbs[:1], run_http)
            for name, sc in scenarios.items():
                if "HTTP" in name and cmd in name:
                    sc.statements, sc.statements_how = per_action, "pg_stat_database xacts"
    monitor.close()

    lines = [
        f"{'scenario':<30} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/op':>10} "
        f"{'stmts/op':>9} {'WAL B/op':>9}  statements counted by",
    ]
    for sc in scenarios.values():
        stmts = f"{sc.statements:.2f}" if sc.statements is not None else "-"
        wal = f"{sc.wal():.0f}" if sc.runs else "-"
        lines.append(f"{sc.name:<30} {sc.ops():>8.0f} {sc.pct(0.5):>8.2f} {sc.pct(0.99):>8.2f} "
                     f"{sc.cpu_ms():>10.2f} {stmts:>9} {wal:>9}  {sc.statements_how}")
    lines.append("")
    lines.append(f"ratios (median of {args.rounds} rounds; each ratio within one round):")
    for name, values in ratios.items():
        lines.append(f"  {name:<52} {statistics.median(values):6.2f}   "
                     f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")
    http_replay = scenarios["ledger HTTP       replay 16c"]
    http_fresh = scenarios["ledger HTTP       fresh  16c"]
    lines.append(f"  HTTP replay 16c: {http_replay.ops():.0f}/s (≥ 1000), "
                 f"p99 {http_replay.pct(0.99):.1f} ms (< 50)")
    lines.append(f"  HTTP fresh 16c: p99 {http_fresh.pct(0.99):.1f} ms (< 100)")
    cores = os.cpu_count() or 1
    lines.append(
        f"  CPU per HTTP replay {http_replay.cpu_ms():.2f} ms, per HTTP fresh "
        f"{http_fresh.cpu_ms():.2f} ms (granian + PostgreSQL + client, not the provider): "
        f"{cores} idle cores would serve about {cores * 1000 / http_replay.cpu_ms():.0f} "
        f"replays/s")
    lines.append(f"machine: {os.cpu_count()} cores, load average "
                 f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
