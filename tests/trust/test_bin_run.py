"""bin/run (bin/serve.py): full status-page URLs on the console, request logs in files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_bin_run_prints_full_status_urls_and_keeps_request_logs_off_the_console(tmp_path):
    port, sandbox, smtp = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CACHE_URL"}}
    env |= {"LEDGER_VAR_DIR": str(tmp_path), "SANDBOX_TIMEOUT_SLEEP_SECONDS": "2",
            "LEDGER_PROVIDER_TIMEOUT_SECONDS": "1", "CELERY_BROKER_URL": "filesystem://"}
    console = tmp_path / "console.txt"
    with console.open("wb") as out:
        run = subprocess.Popen(
            [sys.executable, "bin/serve.py", "--port", str(port), "--sandbox-port", str(sandbox),
             "--sandbox-smtp-port", str(smtp)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "is up" not in console.read_text() and time.monotonic() < deadline:
            assert run.poll() is None, console.read_text()
            time.sleep(0.5)
        text = console.read_text()
        assert "is up" in text, text
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=60)

    status_lines = [line for line in text.splitlines() if "status page:" in line]
    assert status_lines
    assert all(f"status page: http://127.0.0.1:{port}/status/" in line for line in status_lines)
    assert "HTTP/1.1" not in text and '"GET /' not in text  # no per-request log lines
    assert (tmp_path / "log" / "web.log").exists()
    assert (tmp_path / "log" / "worker.log").exists()
    assert not (tmp_path / "prometheus").exists()  # the metrics directory is cleaned up
