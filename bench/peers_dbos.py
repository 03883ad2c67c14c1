"""The DBOS peer for bench/peers.py — runs in bench/.venv-peers (dbos 3.4), never in the
service's environment. bench/peers.py starts it and talks to it over stdin/stdout:

    in:  {"cmd": "fresh"|"replay", "threads": N, "ops": N, "prefix": "..."}   (one JSON line)
    out: {"latencies": [seconds, ...], "wall": seconds, "statements": N, "commits": N}

fresh: a workflow with one no-op step under a new workflow ID (DBOS records the workflow, the
step's output and the result in its system database, with durable commits).
replay: the same workflow called again under the ID of a completed one (DBOS returns the
recorded result without running the step).
Statements and commits are counted at SQLAlchemy's cursor and transaction events (what DBOS's
engine sends; libpq-level BEGIN is counted as one statement per transaction).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dbos import DBOS, DBOSConfig, SetWorkflowID
from sqlalchemy import event
from sqlalchemy.engine import Engine

COUNTS = {"statements": 0, "commits": 0}
_lock = threading.Lock()


@event.listens_for(Engine, "before_cursor_execute")
def _count_statement(*args: object, **kwargs: object) -> None:
    with _lock:
        COUNTS["statements"] += 1


@event.listens_for(Engine, "commit")
def _count_commit(*args: object, **kwargs: object) -> None:
    with _lock:
        COUNTS["commits"] += 1


config: DBOSConfig = {
    "name": "ledger-peers-bench",
    "system_database_url": os.environ["PEERS_DBOS_URL"],
    "log_level": "WARNING",
    "console_log_level": "WARNING",
    "sys_db_pool_size": 40,
}
DBOS(config=config)


@DBOS.step()
def noop_step(n: int) -> int:
    return n


@DBOS.workflow()
def one_step_workflow(n: int) -> int:
    return noop_step(n)


def _one(workflow_id: str, n: int) -> float:
    started = time.perf_counter()
    with SetWorkflowID(workflow_id):
        assert one_step_workflow(n) == n
    return time.perf_counter() - started


def run(cmd: str, threads: int, ops: int, prefix: str) -> dict[str, object]:
    ids = [f"{prefix}-{i}" for i in range(ops)]
    if cmd == "replay":
        for i, wid in enumerate(ids):  # completed first, outside the timing
            _one(wid, i)
    with _lock:
        COUNTS.update(statements=0, commits=0)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        latencies = list(pool.map(_one, ids, range(ops)))
    wall = time.perf_counter() - started
    return {"latencies": latencies, "wall": wall, **COUNTS}


def main() -> None:
    DBOS.launch()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request["cmd"] == "quit":
            break
        print(json.dumps(run(request["cmd"], request["threads"], request["ops"],
                             request["prefix"])), flush=True)
    DBOS.destroy()


if __name__ == "__main__":
    main()
