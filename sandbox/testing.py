"""Test helpers: run the sandbox as a real subprocess and talk to its control API.

with SandboxServer(env={"SANDBOX_TIMEOUT_SLEEP_SECONDS": "0.5"}, smtp=True) as server:
    client = SandboxClient(server.url)
    ...  # e-mail goes to 127.0.0.1:server.smtp_port
    assert client.effect_counts() == {"op-1": 1}
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"sandbox listening on (http://\S+)")
SMTP_LISTENING = re.compile(r"sandbox smtp listening on \S+:(\d+)")


def stop_process(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class SandboxServer:
    """`python -m sandbox` on a free 127.0.0.1 port with a fresh temporary database; with
    `smtp=True` its SMTP listener too, on another free port (`smtp_port`)."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        smtp: bool = False,
        startup_timeout: float = 10.0,
    ) -> None:
        self.env = dict(env or {})
        self.smtp = smtp
        self.startup_timeout = startup_timeout
        self.url = ""
        self.smtp_port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def db_path(self) -> Path:
        assert self._workdir is not None, "server not started"
        return self._workdir / "sandbox.sqlite3"

    @property
    def log_path(self) -> Path:
        assert self._workdir is not None, "server not started"
        return self._workdir / "sandbox.log"

    def log(self) -> str:
        """Everything the server wrote to stderr so far (handy in assertion messages)."""
        return self.log_path.read_text(errors="replace") if self._workdir else ""

    def start(self) -> SandboxServer:
        if self._process is not None:
            return self
        self._workdir = Path(tempfile.mkdtemp(prefix="agent-ledger-sandbox-"))
        self._log_file = self.log_path.open("wb")
        # Port 0: the server binds a free port itself and prints it, so there is no race
        # between picking a port here and binding it there.
        command = [sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", "0"]
        if self.smtp:
            command += ["--smtp-port", "0"]
        self._process = subprocess.Popen(
            [*command, "--db", str(self.db_path)],
            cwd=PROJECT_ROOT,
            env=self._child_env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _child_env(self) -> dict[str, str]:
        # Inherited SANDBOX_* settings would make tests depend on the caller's shell.
        env = {name: value for name, value in os.environ.items() if not name.startswith("SANDBOX_")}
        env["PYTHONUNBUFFERED"] = "1"
        return env | self.env

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"sandbox exited during startup:\n{self.log()}")
            if not self.url:
                log = self.log()
                match = LISTENING.search(log)
                self.url = match.group(1) if match else ""
                smtp_match = SMTP_LISTENING.search(log) if self.smtp else None
                self.smtp_port = int(smtp_match.group(1)) if smtp_match else None
            if self.url and self._healthy():
                if self.smtp and self.smtp_port is None:
                    raise RuntimeError(f"sandbox started without SMTP:\n{self.log()}")
                return
            time.sleep(0.05)
        raise RuntimeError(f"sandbox not healthy after {self.startup_timeout}s:\n{self.log()}")

    def _healthy(self) -> bool:
        try:
            response = httpx.get(f"{self.url}/_sandbox/health", timeout=1.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self.url = ""
        self.smtp_port = None

    def client(self) -> SandboxClient:
        return SandboxClient(self.url)

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class SandboxClient:
    """The sandbox's control API (`/_sandbox/`): effects log, clock, runtime config."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url
        self._http = httpx.Client(base_url=url, timeout=timeout)

    def _get(self, path: str, **params: str) -> Any:
        response = self._http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        response = self._http.post(path, json=dict(body))
        response.raise_for_status()
        return response.json()

    def health(self) -> bool:
        return bool(self._get("/_sandbox/health").get("ok"))

    @property
    def smtp_port(self) -> int | None:
        """The port the sandbox accepts e-mail on, or None if it was started without SMTP."""
        port = self._get("/_sandbox/health").get("smtp_port")
        return None if port is None else int(port)

    def messages(self, **query: str) -> list[dict[str, Any]]:
        """The e-mail provider's message search (`message_id=` or `reference=`), subject to
        index lag like any lookup; newest first."""
        return list(self._get("/v1/messages", **query)["data"])

    def effects(self, reference: str | None = None) -> list[dict[str, Any]]:
        """Every effect ever executed (ignores lookup lag), oldest first."""
        params = {} if reference is None else {"reference": reference}
        return list(self._get("/_sandbox/effects", **params)["data"])

    def effect_counts(self) -> dict[str, int]:
        """How many times each reference really executed."""
        return dict(self._get("/_sandbox/effects")["counts"])

    def request_counts(self) -> dict[str, Any]:
        """{"total": n, "by_reference": {...}, "by_fault": {...}} over POST /v1/effects/* and
        POST /v1/refunds."""
        return dict(self._get("/_sandbox/requests"))

    def now(self) -> float:
        return float(self._get("/_sandbox/clock")["now"])

    def advance_clock(self, seconds: float) -> float:
        """Move the sandbox clock forward; returns the new sandbox time."""
        return float(self._post("/_sandbox/clock", {"advance": seconds})["now"])

    def set_clock_offset(self, offset: float) -> float:
        return float(self._post("/_sandbox/clock", {"offset": offset})["now"])

    def configure(self, **settings: Any) -> dict[str, Any]:
        return dict(self._post("/_sandbox/config", settings))

    def config(self) -> dict[str, Any]:
        return dict(self._get("/_sandbox/config"))

    def reset(self) -> None:
        self._post("/_sandbox/reset", {})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
