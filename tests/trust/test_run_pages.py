"""GET /api/v1/runs/{run_id}/operations: bounded keyset pages, and the first unresolved
operation answered by its own indexed query on every page."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import Operation
from tests.ledger.factories import in_state

S = Operation.Status
PROBLEM = "application/problem+json"


def seed_run(agent, statuses, run_id="run-9", start=0):
    rows = []
    for n, status in enumerate(statuses, start=start):
        operation = in_state(agent, status, operation_id=f"wf-9:inv-{n}:refund-1:v1")
        Operation.objects.filter(pk=operation.pk).update(run_id=run_id)  # not a status field
        rows.append(operation.operation_id)
    return rows


def test_pages_follow_next_until_null_in_recording_order(api, agent):
    ids = seed_run(agent, [S.SUCCEEDED] * 3 + [S.UNKNOWN] + [S.SUCCEEDED] * 3)

    first = api.get("/api/v1/runs/run-9/operations?limit=3").json()
    second = api.get(first["next"]).json()
    third = api.get(second["next"]).json()

    assert [page["count"] for page in (first, second, third)] == [3, 3, 1]
    seen = [op["operation_id"] for page in (first, second, third) for op in page["operations"]]
    assert seen == ids
    assert first["next"].startswith("http://testserver/api/v1/runs/run-9/operations?")
    assert third["next"] is None
    # Every page names the same first unresolved operation, even pages that do not hold it.
    for page in (first, second, third):
        assert page["first_unresolved"]["operation_id"] == ids[3]


def test_default_page_is_bounded(api, agent):
    seed_run(agent, [S.SUCCEEDED] * 55)
    body = api.get("/api/v1/runs/run-9/operations").json()
    assert body["count"] == 50 and len(body["operations"]) == 50
    assert body["next"] is not None
    assert body["first_unresolved"] is None


def test_first_unresolved_is_one_bounded_query_however_long_the_run(api, agent):
    seed_run(agent, [S.SUCCEEDED] * 2 + [S.PREPARED])
    api.get("/api/v1/runs/run-9/operations?limit=1")  # the credential's last-used write
    with CaptureQueriesContext(connection) as short:
        api.get("/api/v1/runs/run-9/operations?limit=1")
    seed_run(agent, [S.SUCCEEDED] * 12, start=100)  # a longer run, same page size
    with CaptureQueriesContext(connection) as long:
        body = api.get("/api/v1/runs/run-9/operations?limit=1").json()

    assert len(long.captured_queries) == len(short.captured_queries)
    unresolved = [q["sql"] for q in long.captured_queries
                  if '"status" IN' in q["sql"] and "NOT" in q["sql"]]
    assert len(unresolved) == 1 and "LIMIT 1" in unresolved[0]
    assert body["first_unresolved"]["status"] == "prepared"


def test_pages_of_a_run_never_include_another_namespace(api, second_agent_api, agent):
    seed_run(agent, [S.SUCCEEDED] * 2)
    body = second_agent_api.get("/api/v1/runs/run-9/operations").json()
    assert body == {"run_id": "run-9", "count": 0, "operations": [], "first_unresolved": None,
                    "next": None}


def test_bad_limits_and_cursors_are_400(api, agent):
    for query in ("limit=0", "limit=201", "limit=x", "after=not-a-cursor", "after=v1.",
                  "after=v1.1x", "after="):
        response = api.get(f"/api/v1/runs/run-9/operations?{query}")
        assert response.status_code == 400, query
        assert response["Content-Type"] == PROBLEM
