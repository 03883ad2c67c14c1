"""Each example runs against a real ledger started like bin/run
(clients/testing/live_instance.py)."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "clients" / "testing"))

from live_instance import LiveInstance  # noqa: E402

_counter = itertools.count(1)


@pytest.fixture(scope="session")
def ledger() -> Iterator[LiveInstance]:
    with LiveInstance(worker=True) as instance:
        yield instance


@pytest.fixture
def workflow_id() -> str:
    return f"example{os.getpid()}-{next(_counter)}"
