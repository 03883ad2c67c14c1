"""Fuzz the agents' API against its own OpenAPI document with Schemathesis, bounded in time.

Starts, on free ports and in a scratch directory, the sandbox provider and the web service
under gunicorn (deploy/gunicorn.conf.py), creates an agent, and runs `st run` against
/api/schema/ with every check (schemathesis.toml sets what a schema-valid request may still
get). Exits with Schemathesis's status: 0 means no failures. Run by .ci/run.

    .venv/bin/python bin/fuzz_api.py [--max-examples 100] [--time-limit 600] [--seed N]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from serve import wait_for  # bin/ is this script's directory, so on sys.path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# The slowest answer the API gives on purpose here: a long poll, held at most a second (below),
# with a wide margin for a busy 2-core machine.
LONGEST_ANSWER_SECONDS = 15


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--time-limit", type=float, default=600.0,
                        help="seconds the Schemathesis run may take before it counts as failed")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ledger-fuzz-") as scratch:
        web_port, sandbox_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CACHE_URL"}}
        env |= {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "LEDGER_VAR_DIR": scratch,
            "SANDBOX_URL": f"http://127.0.0.1:{sandbox_port}",
            "LEDGER_PROVIDER_TIMEOUT_SECONDS": "1",
            # The fuzzer is one client sending hundreds of requests: not what throttles are for.
            "LEDGER_AGENT_RATE": "1000000/min",
            # Schemathesis follows POST -> GET links with wait up to 30 on operations that stay
            # pending (client-executed tools): hold each poll a second, not thirty, or a few of
            # them use up the time limit. The document and the 0-30 check are unchanged.
            "LEDGER_LONG_POLL_MAX_SECONDS": "1",
            "GUNICORN_BIND": f"127.0.0.1:{web_port}",
            "GUNICORN_WORKERS": "2",
        }
        python = sys.executable
        subprocess.run([python, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env,
                       check=True)
        created = subprocess.run(
            [python, "manage.py", "create_agent", "fuzzer", "--tools",
             "refund,send_email,create_ticket"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True)
        token = created.stdout.strip().splitlines()[-1]
        logs = Path(scratch) / "logs.txt"
        processes: list[subprocess.Popen[bytes]] = []
        try:
            with logs.open("ab") as log:
                processes.append(subprocess.Popen(
                    [python, "-m", "sandbox", "--host", "127.0.0.1", "--port", str(sandbox_port),
                     "--db", str(Path(scratch) / "sandbox.sqlite3")],
                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
                processes.append(subprocess.Popen(
                    [str(BIN / "gunicorn"), "-c", "deploy/gunicorn.conf.py", "config.wsgi"],
                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
            wait_for(f"http://127.0.0.1:{sandbox_port}/_sandbox/health", timeout=30.0)
            wait_for(f"http://127.0.0.1:{web_port}/healthz", timeout=30.0)
            command = [
                str(BIN / "st"), "--config-file", str(ROOT / "schemathesis.toml"), "run",
                f"http://127.0.0.1:{web_port}/api/schema/",
                "--header", f"Authorization: Bearer {token}",
                "--checks", "all", "--max-examples", str(args.max_examples), "--no-color",
                # A long poll (GET …?wait=) answers slowly by design: give it time rather
                # than count it as a network error.
                "--request-timeout", str(LONGEST_ANSWER_SECONDS),
                "--max-response-time", str(LONGEST_ANSWER_SECONDS),
            ]
            if args.seed is not None:
                command += ["--seed", str(args.seed)]
            try:
                return subprocess.run(command, cwd=ROOT, env=env,
                                      timeout=args.time_limit).returncode
            except subprocess.TimeoutExpired:
                print(f"Schemathesis took longer than {args.time_limit:.0f}s", file=sys.stderr)
                return 1
        finally:
            for process in reversed(processes):
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
            if logs.exists() and "Traceback" in logs.read_text(errors="replace"):
                print(logs.read_text(errors="replace")[-5000:], file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
