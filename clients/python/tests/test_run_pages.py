"""Paginated runs (?limit, ?after, next): run() follows every page."""

from __future__ import annotations

from agent_ledger_client import operation_id
from conftest import refund_params


def test_run_follows_every_page(client, unique):
    for n in range(1, 6):
        client.submit("refund", refund_params(f"invoice-7{n}"), run_id=unique,
                      operation_id=operation_id(workflow=unique, subject=f"invoice-7{n}",
                                                action="refund", sequence=n))
    first = client.run_page(unique, limit=2)
    assert len(first.operations) == 2 and first.next
    run = client.run(unique, page_size=2)
    assert [op.subject for op in run.operations] == [f"invoice-7{n}" for n in range(1, 6)]
