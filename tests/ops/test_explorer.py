"""The operations explorer at /ops/operations/ and one operation's page."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ledger import transitions as ledger_transitions
from ledger.models import Operation
from ops.explorer import redact
from reconciliation import transitions as case_transitions
from reconciliation.models import Case
from tests.ops.conftest import op_in, ops_in_every_state
from tests.review.factories import review_case

S = Operation.Status
ROW = re.compile(r'<th scope="row" class="mono"><a href="[^"]+">([^<]+)</a>')


def listed(client: Client, query: str) -> list[str]:
    response = client.get(f"/ops/operations/?{query}")
    assert response.status_code == 200
    return ROW.findall(response.content.decode())


def test_newest_first_by_default(ops_client: Client, agent: Any, frozen: Any) -> None:
    for n in range(1, 4):
        op_in(agent, S.SUCCEEDED, n)
        frozen.shift(1)
    assert listed(ops_client, "") == [f"wf-{n}:invoice-{n}:refund-1:v1" for n in (3, 2, 1)]


def test_search_finds_an_operation_by_each_identifier(ops_client: Client, agent: Any,
                                                      make_agent: Any) -> None:
    target = op_in(agent, S.SUCCEEDED, 7)
    Operation.objects.filter(pk=target.pk).update(run_id="run-77", customer_ref="CUST-7")
    other_agent, _ = make_agent("agent-other")
    op_in(other_agent, S.SUCCEEDED, 8)
    op_in(agent, S.UNKNOWN, 9)
    wanted = [target.operation_id]
    assert listed(ops_client, "q=wf-7:invoice-7:refund-1:v1") == wanted
    assert listed(ops_client, "q=wf-7:") == wanted  # an operation ID's beginning
    assert listed(ops_client, "q=run-77") == wanted
    assert listed(ops_client, "q=CUST-7") == wanted
    assert listed(ops_client, "q=eff_7") == wanted  # the provider's reference
    assert listed(ops_client, "q=invoice-7") == wanted  # the subject
    assert listed(ops_client, "q=agent-other") == ["wf-8:invoice-8:refund-1:v1"]
    assert listed(ops_client, "q=nothing-like-this") == []


def test_filters_by_status_tool_provider_agent_and_time(ops_client: Client, agent: Any,
                                                        make_agent: Any, frozen: Any) -> None:
    early = op_in(agent, S.UNKNOWN, 1)
    frozen.shift(3600)
    since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M")
    frozen.shift(60)
    late = op_in(agent, S.SUCCEEDED, 2)
    other_agent, _ = make_agent("agent-other")
    other = op_in(other_agent, S.UNKNOWN, 3)
    assert listed(ops_client, "status=unknown") == [other.operation_id, early.operation_id]
    assert listed(ops_client, "status=unknown&agent=agent-1") == [early.operation_id]
    assert listed(ops_client, "tool=refund&provider=sandbox&status=succeeded") == [
        late.operation_id]
    assert listed(ops_client, "tool=send_email") == []
    assert listed(ops_client, f"since={since}") == [other.operation_id, late.operation_id]
    assert listed(ops_client, f"until={since}") == [early.operation_id]


def test_keyset_pages_cover_everything_once(ops_client: Client, agent: Any,
                                            monkeypatch: Any) -> None:
    from ops import explorer

    monkeypatch.setattr(explorer, "PAGE_SIZE", 4)
    made = {op.operation_id for op in ops_in_every_state(agent, 1, 2)}  # 10, same timestamp
    seen: list[str] = []
    url = "/ops/operations/?status="
    for _ in range(5):
        html = ops_client.get(url).content.decode()
        seen += ROW.findall(html)
        nxt = re.search(r'id="next-page" rel="next" href="([^"]+)"', html)
        if not nxt:
            break
        url = nxt.group(1).replace("&amp;", "&")
        assert "offset" not in url
    assert len(seen) == 10 and set(seen) == made


def test_a_forged_page_cursor_is_a_400_with_a_clear_message(ops_client: Client) -> None:
    response = ops_client.get("/ops/operations/?after=not-a-cursor")
    assert response.status_code == 400
    assert "This page link is not valid" in response.content.decode()


def test_the_explorer_costs_the_same_number_of_queries_whatever_the_data(
        ops_client: Client, agent: Any) -> None:
    def queries() -> list[int]:
        found = []
        for query in ("", "q=wf-1:", "status=unknown&tool=refund", "problem=past_sla",
                      "agent=agent-1&since=2020-01-01T00:00"):
            with CaptureQueriesContext(connection) as captured:
                assert ops_client.get(f"/ops/operations/?{query}").status_code == 200
            found.append(len(captured))
        return found

    ops_in_every_state(agent, 1, 1)
    few = queries()
    ops_in_every_state(agent, 100, 15)
    assert queries() == few
    assert max(few) <= 6


def test_operation_page_shows_intent_attempts_timeline_evidence_and_links(
        ops_client: Client, agent: Any) -> None:
    case = review_case(agent, 5, card_token="tok_live_secret_value")
    operation = case.operation
    case_transitions.case_record_evidence(case=case, kind="lookup", request={"by": "key"},
                                          response={"found": False}, outcome="not_found",
                                          actor="reconciler")
    claim = ledger_transitions.operation_claim(operation, worker="reconciler", lease_seconds=60,
                                               from_status=S.UNKNOWN, reason="reconciler_resend")
    assert claim is not None
    with CaptureQueriesContext(connection) as captured:
        response = ops_client.get(f"/ops/operations/{operation.pk}/")
    assert response.status_code == 200
    assert len(captured) <= 8
    html = response.content.decode()
    assert "tok_live_secret_value" not in html
    assert "[redacted]" in html
    # Two attempts: fencing token 1 (unknown) and 2 (the re-send, no answer yet).
    assert re.search(r'<td class="num">1</td>.*?timeout_after_send', html, re.S)
    assert re.search(r'<td class="num">2</td>.*?reconciler_resend.*?no answer yet', html, re.S)
    assert "case_opened" in html and "intent_recorded" in html  # merged timeline
    assert "high_value" in html
    assert "not_found" in html  # evidence
    assert f"/status/{operation.status_token}/" in html
    assert f"/review/cases/{case.pk}/" in html
    assert Case.objects.count() == 1


def test_unknown_operation_page_is_404(ops_client: Client) -> None:
    assert ops_client.get("/ops/operations/999999/").status_code == 404


def test_redaction_covers_the_tools_secret_fields_and_secret_looking_names() -> None:
    assert redact({"amount": 1, "pin": "1234", "api_key": "k", "Password": "p"}, ("pin",)) == {
        "amount": 1, "pin": "[redacted]", "api_key": "[redacted]", "Password": "[redacted]"}
