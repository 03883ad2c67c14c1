"""python -m sandbox --host 127.0.0.1 --port 8765 --smtp-port 8025 --db var/sandbox.sqlite3"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from sandbox.app import Sandbox
from sandbox.config import ConfigError, SandboxConfig
from sandbox.server import make_server
from sandbox.smtp import SmtpServer, make_smtp_server
from sandbox.store import Store


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox",
        description="Provider simulator that honours Idempotency-Key and injects faults.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--smtp-port", type=int, default=None,
                        help="also accept e-mail over SMTP on this port (0 picks a free port)")
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
    sandbox = Sandbox(Store(db), config)
    server = make_server(args.host, args.port, sandbox)
    smtp_server = None if args.smtp_port is None else _start_smtp(args.host, args.smtp_port,
                                                                  sandbox)
    host, port = server.server_address[:2]
    assert isinstance(host, str)  # an AF_INET/AF_INET6 socket names its host as a str
    # SandboxServer (sandbox.testing) waits for exactly this line to learn the port.
    print(f"sandbox listening on http://{host}:{port} db={db}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if smtp_server is not None:
            smtp_server.shutdown()
            smtp_server.server_close()
        server.server_close()
    return 0


def _start_smtp(host: str, port: int, sandbox: Sandbox) -> SmtpServer:
    smtp_server = make_smtp_server(host, port, sandbox)
    smtp_host, smtp_port = smtp_server.server_address[:2]
    assert isinstance(smtp_host, str)  # an AF_INET/AF_INET6 socket names its host as a str
    sandbox.smtp_port = int(smtp_port)
    threading.Thread(target=smtp_server.serve_forever, name="smtp", daemon=True).start()
    # Printed before the HTTP line, which SandboxServer takes to mean "started".
    print(f"sandbox smtp listening on {smtp_host}:{smtp_port}", file=sys.stderr, flush=True)
    return smtp_server


if __name__ == "__main__":
    sys.exit(main())
