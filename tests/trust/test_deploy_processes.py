"""deploy/: the web server's workers (granian's and gunicorn's) never outlive their master, a
dead granian worker is replaced and its live gauges dropped, and the systemd units stop and
restart the whole process group."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.trust.test_metrics_and_readiness import LIVE_GAUGE_WRITER

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_server(server: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The production web server as deploy/ starts it: granian (deploy/web.py, recommended) or
    gunicorn (deploy/gunicorn.conf.py), with two workers."""
    if server == "granian":
        command = [sys.executable, "deploy/web.py"]
        env = env | {"GRANIAN_PORT": str(port), "GRANIAN_WORKERS": "2"}
    else:
        command = [str(Path(sys.executable).parent / "gunicorn"), "-c", "deploy/gunicorn.conf.py",
                   "config.wsgi"]
        env = env | {"GUNICORN_BIND": f"127.0.0.1:{port}", "GUNICORN_WORKERS": "2"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def two_workers(master: subprocess.Popen[bytes], *, tries: int, pause: float) -> list[int]:
    for _ in range(tries):
        workers = children_of(master.pid)
        if len(workers) == 2:
            break
        time.sleep(pause)
    assert len(workers) == 2
    return workers


def wait_for_workers(master: subprocess.Popen[bytes], port: int) -> list[int]:
    for _ in range(150):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    # The first worker may answer before the master has forked the second one.
    return two_workers(master, tries=100, pause=0.1)


def assert_all_exit(workers: list[int], *, seconds: float) -> None:
    for _ in range(int(seconds * 10)):
        if not any(alive(pid) for pid in workers):
            break
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers), "orphaned workers kept running"


def stop(master: subprocess.Popen[bytes]) -> None:
    children = children_of(master.pid)
    if master.poll() is None:
        master.kill()
    for pid in children:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
@pytest.mark.parametrize("server", ["granian", "gunicorn"])
def test_killing_the_master_takes_its_workers_and_frees_the_port(server, tmp_path):
    port = free_port()
    env = os.environ | {"LEDGER_VAR_DIR": str(tmp_path),
                        "DJANGO_SETTINGS_MODULE": "config.settings"}
    master = start_server(server, port, env)
    try:
        workers = wait_for_workers(master, port)

        master.send_signal(signal.SIGKILL)
        master.wait(timeout=10)

        assert_all_exit(workers, seconds=10)  # the kernel's SIGTERM comes at once; a slow machine
        with socket.socket() as rebind:  # a restart on the same port can bind (as the servers
            rebind.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # bind: REUSEADDR)
            rebind.bind(("127.0.0.1", port))
            rebind.listen()
    finally:
        stop(master)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
@pytest.mark.parametrize("delay", [0.0, 0.4, 0.8])
def test_a_master_killed_while_its_granian_workers_start_takes_them_too(delay, tmp_path):
    """Killed while its workers are still loading the app: the kernel's signal can come before
    a worker has asked for it, or while granian is still installing its handlers (it was seen to
    be swallowed then); the worker's own check of its parent (config.processes.watch_parent)
    still takes it down."""
    env = os.environ | {"LEDGER_VAR_DIR": str(tmp_path),
                        "DJANGO_SETTINGS_MODULE": "config.settings"}
    master = start_server("granian", free_port(), env)
    try:
        workers = two_workers(master, tries=200, pause=0.02)
        time.sleep(delay)

        master.send_signal(signal.SIGKILL)
        master.wait(timeout=10)

        assert_all_exit(workers, seconds=30)
    finally:
        stop(master)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_granian_replaces_a_killed_worker_and_its_live_gauges_go_with_it(tmp_path):
    """granian has no child_exit hook: a dead process's live gauges are dropped by the next
    worker that starts — here the one that replaces a worker killed with SIGKILL."""
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    env = os.environ | {"LEDGER_VAR_DIR": str(tmp_path), "PROMETHEUS_MULTIPROC_DIR": str(metrics),
                        "DJANGO_SETTINGS_MODULE": "config.settings"}
    port = free_port()
    master = start_server("granian", port, env)
    try:
        workers = wait_for_workers(master, port)
        gone = int(subprocess.run([sys.executable, "-c", LIVE_GAUGE_WRITER], env=env, check=True,
                                  capture_output=True, text=True, timeout=60).stdout)
        dead_file = next(metrics.glob(f"gauge_live*_{gone}.db"))

        os.kill(workers[0], signal.SIGKILL)

        for _ in range(200):  # granian respawns a failed worker after its respawn interval
            replacement = set(children_of(master.pid)) - set(workers)
            if replacement and not dead_file.exists():
                break
            time.sleep(0.1)
        assert replacement, "the killed worker was not replaced"
        assert not dead_file.exists(), "the dead process's live gauges are still reported"
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        stop(master)


@pytest.mark.parametrize("unit", ["agent-ledger-web.service", "agent-ledger-worker.service",
                                  "agent-ledger-beat.service"])
def test_every_unit_stops_its_whole_process_group(unit):
    text = (UNITS / unit).read_text()
    assert re.search(r"^KillMode=control-group$", text, re.MULTILINE)
    assert "PartOf=agent-ledger.target" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_units_parse_cleanly():
    units = sorted(str(path) for path in UNITS.iterdir())
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *units],
                            capture_output=True, text=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "is not executable" not in line  # /opt/… absent here
                and "Failed to create" not in line and "bus" not in line.lower()]
    assert problems == []


@pytest.mark.parametrize(("target", "leaks"), [("raw", True), ("cleaned", False)])
def test_no_process_environment_variable_reaches_a_request_under_granian(target, leaks):
    """granian starts each request's environ as a copy of the worker's os.environ (secrets and
    all); the app it serves (config/granian_worker.py) sees only the request's own variables."""
    port = free_port()
    env = os.environ | {"LEDGER_CANARY_SECRET": "do-not-show", "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "granian"), "--interface", "wsgi", "--no-ws",
         "--port", str(port), f"tests.trust.environ_echo_app:{target}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # its own process group: stopped with its worker
    try:
        for _ in range(150):
            try:
                names = httpx.post(f"http://127.0.0.1:{port}/x?y=1", content=b"{}", timeout=1,
                                   headers={"X-Thing": "1"}).json()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert ("LEDGER_CANARY_SECRET" in names) is leaks
        assert ("PATH" in names) is leaks
        # What the request itself brought is there either way.
        assert {"REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REMOTE_ADDR", "HTTP_X_THING",
                "HTTP_HOST", "CONTENT_LENGTH"} <= set(names)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
