"""deploy/: gunicorn's workers never outlive their master, and the systemd units stop and
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_killing_the_master_takes_its_workers_and_frees_the_port(tmp_path):
    port = free_port()
    env = os.environ | {"GUNICORN_BIND": f"127.0.0.1:{port}", "GUNICORN_WORKERS": "2",
                        "LEDGER_VAR_DIR": str(tmp_path),
                        "DJANGO_SETTINGS_MODULE": "config.settings"}
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    master = subprocess.Popen([gunicorn, "-c", "deploy/gunicorn.conf.py", "config.wsgi"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        # The first worker may answer before the master has forked the second one.
        for _ in range(100):
            workers = children_of(master.pid)
            if len(workers) == 2:
                break
            time.sleep(0.1)
        assert len(workers) == 2

        master.send_signal(signal.SIGKILL)
        master.wait(timeout=10)

        for _ in range(100):  # the kernel's SIGTERM arrives at once; allow a slow machine
            if not any(alive(pid) for pid in workers):
                break
            time.sleep(0.1)
        assert not any(alive(pid) for pid in workers), "orphaned workers kept running"
        with socket.socket() as rebind:  # a restart on the same port can bind (as gunicorn
            rebind.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # binds: REUSEADDR)
            rebind.bind(("127.0.0.1", port))
            rebind.listen()
    finally:
        if master.poll() is None:
            master.kill()
        for pid in children_of(master.pid):
            os.kill(pid, signal.SIGKILL)


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
