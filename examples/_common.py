"""What every example shares: where the ledger and the sandbox are, and the effects log."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def settings() -> tuple[str, str, str]:
    """(ledger URL, agent token, sandbox URL) from the environment, defaulting to `bin/run`'s."""
    url = os.environ.get("LEDGER_URL", "http://127.0.0.1:8000")
    token = os.environ.get("LEDGER_TOKEN") or (ROOT / "var" / "demo-agent-token").read_text()
    sandbox = os.environ.get("SANDBOX_URL", "http://127.0.0.1:8765")
    return url, token.strip(), sandbox


def effects(sandbox_url: str, operation_id: str) -> int:
    """How many times the provider really executed this operation (the sandbox's effects log)."""
    response = httpx.get(f"{sandbox_url}/_sandbox/effects", params={"reference": operation_id})
    response.raise_for_status()
    return len(response.json()["data"])
