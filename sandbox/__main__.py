"""python -m sandbox --host 127.0.0.1 --port 8765 --db var/sandbox.sqlite3"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from sandbox.app import Sandbox
from sandbox.config import ConfigError, SandboxConfig
from sandbox.server import make_server
from sandbox.store import Store


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox",
        description="Provider simulator that honours Idempotency-Key and injects faults.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--db", default="var/sandbox.sqlite3", help="SQLite file of its own")
    return parser.parse_args(argv)


def _stop(signum: int, frame: FrameType | None) -> None:
    # Unwinds serve_forever in the main thread so the socket is closed cleanly on SIGTERM.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = SandboxConfig.from_env(os.environ)
    except ConfigError as exc:
        print(f"sandbox: bad configuration: {exc}", file=sys.stderr)
        return 2
    db = Path(args.db)
    db.parent.mkdir(parents=True, exist_ok=True)
    server = make_server(args.host, args.port, Sandbox(Store(db), config))
    host, port = server.server_address[:2]
    # SandboxServer (sandbox.testing) waits for exactly this line to learn the port.
    print(f"sandbox listening on http://{host}:{port} db={db}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
