"""The sandbox's own SQLite storage: effects, idempotency keys, received requests and the clock.

It is deliberately a separate file from the ledger's database: a provider commit has to survive
whatever the ledger does, so the two must never share a transaction.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_MS = 10_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    reference TEXT NOT NULL,
    idempotency_key TEXT,
    created REAL NOT NULL,
    lag REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_reference ON effects (reference);
CREATE INDEX IF NOT EXISTS effects_idempotency_key ON effects (idempotency_key);

-- status: in_progress (claimed; response may already be stored, e.g. while a `timeout` sleeps),
-- completed (response stored, replayed on repeat), dropped (the first attempt committed nothing;
-- kept only so the key is no longer "first" and its fault scenario does not fire again).
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'dropped')),
    token TEXT NOT NULL,
    created REAL NOT NULL,
    response_status INTEGER,
    response_body BLOB,
    request_id TEXT
);

CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    reference TEXT,
    has_key INTEGER NOT NULL,
    fault TEXT,
    received REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    offset_seconds REAL NOT NULL
);
INSERT OR IGNORE INTO clock (id, offset_seconds) VALUES (1, 0);
"""


class ClaimState(Enum):
    FIRST = "first"  # brand-new key (or expired): this request executes, scenarios apply
    RETRY = "retry"  # the first attempt committed nothing: execute normally, no scenario
    REPLAY = "replay"
    MISMATCH = "mismatch"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: bytes
    request_id: str


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    token: str = ""
    response: StoredResponse | None = None


@dataclass(frozen=True)
class NewEffect:
    id: str
    kind: str
    reference: str
    idempotency_key: str | None
    created: float
    lag: float
    body: str


class ClaimLost(RuntimeError):
    """The key record this request claimed is gone (a reset happened while it was running)."""


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        # Held open for the process's life: when the last connection to a WAL database closes,
        # SQLite checkpoints and deletes the WAL (with fsyncs), which made every request that
        # found no other connection open wait ~2 ms per connection it opened.
        self._keeper: sqlite3.Connection | None = None

        # Connections kept by each request thread for its next request (opening one and
        # setting its pragmas cost more CPU than the request's own statements); a nested
        # connect() gets a connection of its own, as before.
        self._idle = threading.local()

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the write lock is taken
        # up front and two requests for one key cannot both read "absent".
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # WAL + NORMAL survives a process crash (what the fault tests model); only a power
        # loss could drop the last commits.
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        idle: list[sqlite3.Connection] = self._idle.__dict__.setdefault("connections", [])
        conn = idle.pop() if idle else self._open()
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        if conn.in_transaction:  # never handed on with a transaction open
            conn.close()
        else:
            idle.append(conn)

    def initialise(self) -> None:
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
            _recover_interrupted(conn)
        if self._keeper is None:
            self._keeper = sqlite3.connect(self.path, check_same_thread=False)


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _recover_interrupted(conn: sqlite3.Connection) -> None:
    # A previous process died mid-request. A stored response means the effect committed
    # (e.g. during a `timeout` sleep); no response means nothing committed.
    with immediate(conn):
        conn.execute(
            "UPDATE idempotency_keys SET status = 'completed'"
            " WHERE status = 'in_progress' AND response_status IS NOT NULL"
        )
        conn.execute("UPDATE idempotency_keys SET status = 'dropped' WHERE status = 'in_progress'")


# --- clock -------------------------------------------------------------------------------------


def clock(conn: sqlite3.Connection) -> tuple[float, float]:
    """(sandbox now, offset). The offset lives in the DB so every thread sees the same clock."""
    (offset,) = conn.execute("SELECT offset_seconds FROM clock WHERE id = 1").fetchone()
    return time.time() + offset, offset


def set_clock(conn: sqlite3.Connection, *, offset: float | None, advance: float | None) -> None:
    if offset is not None:
        conn.execute("UPDATE clock SET offset_seconds = ? WHERE id = 1", (offset,))
    if advance is not None:
        conn.execute(
            "UPDATE clock SET offset_seconds = offset_seconds + ? WHERE id = 1", (advance,)
        )


# --- idempotency keys --------------------------------------------------------------------------


def claim_key(
    conn: sqlite3.Connection, key: str, fingerprint: str, now: float, retention: float
) -> Claim:
    with immediate(conn):
        row = conn.execute(
            "SELECT fingerprint, status, created, response_status, response_body, request_id"
            " FROM idempotency_keys WHERE key = ?",
            (key,),
        ).fetchone()
        if row is None or _expired(row[1], row[2], now, retention):
            return _take(conn, key, fingerprint, now, ClaimState.FIRST)
        stored_fingerprint, status, _, response_status, response_body, request_id = row
        if status == "dropped":
            return _take(conn, key, fingerprint, now, ClaimState.RETRY)
        if stored_fingerprint != fingerprint:
            return Claim(ClaimState.MISMATCH)
        if status == "in_progress":
            return Claim(ClaimState.IN_PROGRESS)
        response = StoredResponse(response_status, bytes(response_body), request_id)
        return Claim(ClaimState.REPLAY, response=response)


def _expired(status: str, created: float, now: float, retention: float) -> bool:
    # An in-progress key never expires under a running request: that request still owns it.
    return status != "in_progress" and now >= created + retention


def _take(
    conn: sqlite3.Connection, key: str, fingerprint: str, now: float, state: ClaimState
) -> Claim:
    # The token makes later updates conditional on still owning this claim (reset/expiry races).
    token = secrets.token_hex(8)
    conn.execute(
        "INSERT OR REPLACE INTO idempotency_keys (key, fingerprint, status, token, created)"
        " VALUES (?, ?, 'in_progress', ?, ?)",
        (key, fingerprint, token, now),
    )
    return Claim(state, token=token)


def commit_outcome(
    conn: sqlite3.Connection,
    *,
    key: str | None,
    token: str,
    effect: NewEffect | None,
    response: StoredResponse,
    settled: bool,
) -> None:
    """Commit the effect and the key's stored response atomically (raises ClaimLost)."""
    with immediate(conn):
        if key is not None:
            cursor = conn.execute(
                "UPDATE idempotency_keys"
                " SET status = ?, response_status = ?, response_body = ?, request_id = ?"
                " WHERE key = ? AND token = ? AND status = 'in_progress'",
                (
                    "completed" if settled else "in_progress",
                    response.status,
                    response.body,
                    response.request_id,
                    key,
                    token,
                ),
            )
            if cursor.rowcount != 1:
                raise ClaimLost(key)
        if effect is not None:
            conn.execute(
                "INSERT INTO effects (id, kind, reference, idempotency_key, created, lag, body)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    effect.id,
                    effect.kind,
                    effect.reference,
                    effect.idempotency_key,
                    effect.created,
                    effect.lag,
                    effect.body,
                ),
            )


def settle_key(conn: sqlite3.Connection, key: str, token: str) -> None:
    conn.execute(
        "UPDATE idempotency_keys SET status = 'completed'"
        " WHERE key = ? AND token = ? AND status = 'in_progress'",
        (key, token),
    )


def drop_key(conn: sqlite3.Connection, key: str, token: str) -> None:
    conn.execute(
        "UPDATE idempotency_keys SET status = 'dropped', response_status = NULL,"
        " response_body = NULL, request_id = NULL WHERE key = ? AND token = ?",
        (key, token),
    )


# --- effects ---------------------------------------------------------------------------------


def _kinds_clause(kinds: Collection[str] | None) -> tuple[list[str], list[Any]]:
    # Each provider API sees only its own kinds: a Stripe refund is not a generic effect.
    if kinds is None:
        return [], []
    ordered = sorted(kinds)
    return [f"kind IN ({', '.join('?' for _ in ordered)})"], list(ordered)


def visible_effects(
    conn: sqlite3.Connection,
    *,
    key: str | None,
    reference: str | None,
    now: float,
    index_lag: float,
    kinds: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Effects a key/reference lookup can see now: the index lags behind the commit."""
    clauses, args = _kinds_clause(kinds)
    clauses.append("created + lag + ? <= ?")
    args.extend([index_lag, now])
    if key is not None:
        clauses.append("idempotency_key = ?")
        args.append(key)
    if reference is not None:
        clauses.append("reference = ?")
        args.append(reference)
    rows = conn.execute(
        f"SELECT body FROM effects WHERE {' AND '.join(clauses)} ORDER BY seq", args
    )
    return [json.loads(body) for (body,) in rows]


def visible_page(
    conn: sqlite3.Connection,
    *,
    kinds: Collection[str],
    matching: Mapping[str, str],
    now: float,
    index_lag: float,
    starting_after: str | None,
    limit: int,
) -> tuple[list[dict[str, Any]], bool]:
    """One newest-first page of what a list lookup can see now, and whether more follow.

    `matching` compares top-level fields of the stored object; `starting_after` is the id of
    the last object of the previous page (raises LookupError if there is no such object).
    """
    clauses, args = _kinds_clause(kinds)
    clauses.append("created + lag + ? <= ?")
    args.extend([index_lag, now])
    for name, value in sorted(matching.items()):
        clauses.append("json_extract(body, ?) = ?")
        args.extend([f"$.{name}", value])
    if starting_after is not None:
        row = conn.execute("SELECT seq FROM effects WHERE id = ?", (starting_after,)).fetchone()
        if row is None:
            raise LookupError(starting_after)
        clauses.append("seq < ?")
        args.append(row[0])
    rows = conn.execute(
        f"SELECT body FROM effects WHERE {' AND '.join(clauses)} ORDER BY seq DESC LIMIT ?",
        [*args, limit + 1],
    ).fetchall()
    return [json.loads(body) for (body,) in rows[:limit]], len(rows) > limit


def effect_by_id(
    conn: sqlite3.Connection, effect_id: str, kinds: Collection[str] | None = None
) -> dict[str, Any] | None:
    clauses, args = _kinds_clause(kinds)
    clauses.append("id = ?")
    args.append(effect_id)
    row = conn.execute(
        f"SELECT body FROM effects WHERE {' AND '.join(clauses)}", args
    ).fetchone()
    return json.loads(row[0]) if row else None


def all_effects(
    conn: sqlite3.Connection, reference: str | None
) -> list[tuple[str, dict[str, Any]]]:
    """(reference, stored object) for every effect: the reference column, not the object,
    names the operation, because each provider API spells its objects differently."""
    if reference is None:
        rows = conn.execute("SELECT reference, body FROM effects ORDER BY seq")
    else:
        rows = conn.execute(
            "SELECT reference, body FROM effects WHERE reference = ? ORDER BY seq", (reference,)
        )
    return [(ref, json.loads(body)) for ref, body in rows]


# --- request log -------------------------------------------------------------------------------


def record_request(
    conn: sqlite3.Connection, *, kind: str, reference: str | None, has_key: bool, received: float
) -> int:
    cursor = conn.execute(
        "INSERT INTO requests (kind, reference, has_key, received) VALUES (?, ?, ?, ?)",
        (kind, reference, int(has_key), received),
    )
    return int(cursor.lastrowid or 0)


def set_request_fault(conn: sqlite3.Connection, seq: int, fault: str) -> None:
    conn.execute("UPDATE requests SET fault = ? WHERE seq = ?", (fault, seq))


def request_counts(conn: sqlite3.Connection) -> dict[str, Any]:
    (total,) = conn.execute("SELECT COUNT(*) FROM requests").fetchone()
    by_reference = conn.execute(
        "SELECT reference, COUNT(*) FROM requests WHERE reference IS NOT NULL"
        " GROUP BY reference ORDER BY reference"
    )
    by_fault = conn.execute(
        "SELECT fault, COUNT(*) FROM requests WHERE fault IS NOT NULL GROUP BY fault ORDER BY fault"
    )
    return {"total": total, "by_reference": dict(by_reference), "by_fault": dict(by_fault)}


def reset(conn: sqlite3.Connection) -> None:
    with immediate(conn):
        for table in ("effects", "idempotency_keys", "requests"):
            conn.execute(f"DELETE FROM {table}")
        conn.execute("UPDATE clock SET offset_seconds = 0 WHERE id = 1")
