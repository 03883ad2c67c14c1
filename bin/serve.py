"""Process supervisor for the embedded default (started by bin/run).

Starts the sandbox provider, migrates and seeds, then the web server and a Celery worker with
embedded beat. If any process exits, or on Ctrl-C / SIGTERM, everything is stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def wait_for(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy within {timeout:.0f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("LEDGER_PORT", "8000")))
    parser.add_argument("--sandbox-port", type=int,
                        default=int(os.environ.get("SANDBOX_PORT", "8765")))
    parser.add_argument("--sandbox-smtp-port", type=int,
                        default=int(os.environ.get("SANDBOX_SMTP_PORT", "8025")))
    parser.add_argument("--no-seed", action="store_true", help="skip the demo data")
    args = parser.parse_args()

    var = ROOT / "var"
    for folder in (var / "broker" / "out", var / "broker" / "processed"):
        folder.mkdir(parents=True, exist_ok=True)
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SANDBOX_URL": f"http://127.0.0.1:{args.sandbox_port}",
        "SANDBOX_SMTP_PORT": str(args.sandbox_smtp_port),
        "PYTHONUNBUFFERED": "1",
        # Read by config/tools-stripe-smtp.toml (env:STRIPE_API_KEY): an explicit dev default
        # that only the sandbox's Stripe slice accepts.
        "STRIPE_API_KEY": os.environ.get("STRIPE_API_KEY", "sk_test_sandbox"),
    }
    sandbox_env = env | {"SANDBOX_TIMEOUT_SLEEP_SECONDS": env.get("SANDBOX_TIMEOUT_SLEEP_SECONDS",
                                                                  "15")}
    manage = [PYTHON, "manage.py"]
    children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(name: str, command: list[str], child_env: dict[str, str]) -> None:
        print(f"[run] starting {name}: {' '.join(command)}", flush=True)
        children.append((name, subprocess.Popen(command, cwd=ROOT, env=child_env)))

    def stop_all(*_: object) -> None:
        for _name, process in reversed(children):
            if process.poll() is None:
                process.terminate()
        for _name, process in children:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()

    def on_sigterm(*_: object) -> None:
        stop_all()
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True)
        start("sandbox", [PYTHON, "-m", "sandbox", "--host", "127.0.0.1", "--port",
                          str(args.sandbox_port), "--smtp-port", str(args.sandbox_smtp_port),
                          "--db", str(var / "sandbox.sqlite3")],
              sandbox_env)
        wait_for(f"http://127.0.0.1:{args.sandbox_port}/_sandbox/health")
        start("worker", [PYTHON, "-m", "celery", "-A", "config", "worker", "--beat",
                         "--loglevel", "INFO", "--concurrency", "2",
                         "--schedule", str(var / "celerybeat-schedule")], env)
        start("web", [*manage, "runserver", f"127.0.0.1:{args.port}", "--noreload"], env)
        wait_for(f"http://127.0.0.1:{args.port}/healthz")
        if not args.no_seed:
            subprocess.run([*manage, "seed_demo"], cwd=ROOT, env=env, check=True)
        print(f"\n[run] Agent Ledger is up: http://127.0.0.1:{args.port}/  (Ctrl-C stops all)\n",
              flush=True)
        while True:
            for name, process in children:
                if process.poll() is not None:
                    print(f"[run] {name} exited with {process.returncode}; stopping", flush=True)
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\n[run] stopping…", flush=True)
        return 0
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
