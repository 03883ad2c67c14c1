"""Start a real Agent Ledger the way bin/run does, for the SDK and example test suites.

Standard library only, so any Python can import it (the SDK's venv, the examples' venv) while
the service itself runs on the project's own `.venv`. It starts, on free 127.0.0.1 ports:

- the sandbox provider (`python -m sandbox`, its own SQLite file),
- a fresh SQLite ledger database in a temporary folder (`manage.py migrate`),
- the web server (`manage.py runserver --noreload`),
- optionally a Celery worker with the beat schedule on a filesystem broker (async submissions,
  reconciliation sweeps), exactly as bin/serve.py does,

and creates agent credentials with `manage.py create_agent`.

From Python:

    with LiveInstance() as ledger:
        ledger.url, ledger.token, ledger.effect_counts()

From any other language (the Node suite does this): run
`python clients/testing/live_instance.py [--no-worker] [--env NAME=VALUE ...]`; it prints one JSON
line `{"url", "sandbox_url", "tokens": {...}}` and keeps the instance up until its standard input
closes or it receives SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

# LEDGER_ROOT runs another checkout of the service (for example a merge being tried out).
ROOT = Path(os.environ.get("LEDGER_ROOT") or Path(__file__).resolve().parents[2])
SANDBOX_LISTENING = re.compile(r"sandbox listening on (http://\S+)")
ALL_TOOLS = "refund,send_email,create_ticket"

# Agents every instance has: the main one may use every tool; "narrow" only send_email (for 403s).
AGENTS = {"main": ALL_TOOLS, "narrow": "send_email"}


def service_python() -> str:
    """The project's own interpreter (bin/run's .venv); LEDGER_SERVICE_PYTHON overrides it."""
    explicit = os.environ.get("LEDGER_SERVICE_PYTHON")
    if explicit:
        return explicit
    candidate = ROOT / ".venv" / "bin" / "python"
    if not candidate.exists():
        raise RuntimeError(f"{candidate} is missing: run bin/test or bin/run once to create it")
    return str(candidate)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
        return json.loads(response.read())


class LiveInstance:
    def __init__(self, *, worker: bool = True, env: Mapping[str, str] | None = None,
                 startup_timeout: float = 60.0) -> None:
        self.worker = worker
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.url = ""
        self.sandbox_url = ""
        self.tokens: dict[str, str] = {}
        self._workdir: Path | None = None
        self._env: dict[str, str] = {}
        self._children: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    @property
    def token(self) -> str:
        return self.tokens["main"]

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> LiveInstance:
        self._workdir = Path(tempfile.mkdtemp(prefix="agent-ledger-live-"))
        try:
            self._start_sandbox()
            env = self._env = self._service_env()
            self._manage(["migrate", "--noinput"], env)
            for name, tools in AGENTS.items():
                self.tokens[name] = self._create_agent(f"sdk-{name}", tools, env)
            port = free_port()
            self._spawn("web", [service_python(), "manage.py", "runserver",
                                f"127.0.0.1:{port}", "--noreload"], env)
            self.url = f"http://127.0.0.1:{port}"
            if self.worker:
                self._spawn("worker", [service_python(), "-m", "celery", "-A", "config", "worker",
                                       "--beat", "--loglevel", "INFO", "--concurrency", "2",
                                       "--schedule", str(self._workdir / "celerybeat-schedule")],
                            env)
            self._wait_healthy(f"{self.url}/healthz")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sandbox(self) -> None:
        assert self._workdir is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
        env |= {"PYTHONUNBUFFERED": "1", "SANDBOX_TIMEOUT_SLEEP_SECONDS": "2"}
        env |= {k: v for k, v in self.extra_env.items() if k.startswith("SANDBOX_")}
        log = self._spawn("sandbox", [service_python(), "-m", "sandbox", "--host", "127.0.0.1",
                                      "--port", "0", "--db",
                                      str(self._workdir / "sandbox.sqlite3")], env)
        deadline = time.monotonic() + self.startup_timeout
        while not self.sandbox_url:
            match = SANDBOX_LISTENING.search(log.read_text(errors="replace"))
            if match:
                self.sandbox_url = match.group(1)
            elif time.monotonic() > deadline or self._children[-1][1].poll() is not None:
                raise RuntimeError(f"sandbox did not start:\n{self.log('sandbox')}")
            else:
                time.sleep(0.05)
        self._wait_healthy(f"{self.sandbox_url}/_sandbox/health")

    def _service_env(self) -> dict[str, str]:
        assert self._workdir is not None
        var = self._workdir / "var"
        for folder in ("broker/out", "broker/processed", "broker/control"):
            (var / folder).mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL"}}
        env |= {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "LEDGER_VAR_DIR": str(var),
            "SANDBOX_URL": self.sandbox_url,
            "PYTHONUNBUFFERED": "1",
            # Short waits so the suites see reconciliation and retries within seconds.
            "LEDGER_PROVIDER_TIMEOUT_SECONDS": "1",
            "LEDGER_RETRY_AFTER_SECONDS": "1",
            "LEDGER_SWEEP_INTERVAL_SECONDS": "1",
            "RECONCILIATION_BACKOFF_BASE_SECONDS": "0.5",
            # A case whose check died with its worker is due again after this, not 120 s.
            "RECONCILIATION_CASE_VISIBILITY_SECONDS": "20",
        }
        return env | {k: v for k, v in self.extra_env.items() if not k.startswith("SANDBOX_")}

    def _manage(self, args: list[str], env: Mapping[str, str]) -> str:
        done = subprocess.run([service_python(), "manage.py", *args], cwd=ROOT, env=dict(env),
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def manage(self, *args: str) -> str:
        """Run a management command against this instance; returns its standard output."""
        return self._manage(list(args), self._env)

    def _create_agent(self, name: str, tools: str, env: Mapping[str, str]) -> str:
        output = self._manage(["create_agent", name, "--tools", tools], env)
        return output.strip().splitlines()[-1].strip()

    def _spawn(self, name: str, command: list[str], env: Mapping[str, str]) -> Path:
        assert self._workdir is not None
        log_path = self._workdir / f"{name}.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(command, cwd=ROOT, env=dict(env), stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=subprocess.STDOUT)
        self._children.append((name, process, log_file))
        return log_path

    def _wait_healthy(self, url: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            for name, process, _log in self._children:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited during startup:\n{self.log(name)}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{url} not healthy after {self.startup_timeout}s")

    def log(self, name: str) -> str:
        if self._workdir is None:
            return ""
        path = self._workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for _name, process, _log in reversed(self._children):
            if process.poll() is None:
                process.terminate()
        for _name, process, log_file in self._children:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log_file.close()
        self._children.clear()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> LiveInstance:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    # --- the sandbox's effects log (what really executed at the provider) -----------------
    def effects(self, reference: str | None = None) -> list[dict[str, Any]]:
        query = "" if reference is None else "?" + urllib.parse.urlencode({"reference": reference})
        return list(_get_json(f"{self.sandbox_url}/_sandbox/effects{query}")["data"])

    def effect_counts(self) -> dict[str, int]:
        return dict(_get_json(f"{self.sandbox_url}/_sandbox/effects")["counts"])

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "sandbox_url": self.sandbox_url, "tokens": self.tokens,
                "worker": self.worker}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a throwaway Agent Ledger for SDK tests.")
    parser.add_argument("--no-worker", action="store_true", help="no Celery worker/beat")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the service (e.g. LEDGER_AGENT_RATE=3/s)")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.env)
    instance = LiveInstance(worker=not args.no_worker, env=extra)

    def on_term(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        instance.start()
        print(json.dumps(instance.describe()), flush=True)
        sys.stdin.read()  # until the parent closes our stdin (or dies)
    except KeyboardInterrupt:
        pass
    finally:
        instance.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
