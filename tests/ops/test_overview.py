"""The overview at /ops/: staff only, the now-figures with the lists behind them, the alert
banners, the charts' text alternatives, and a cost that does not grow with the ledger."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ledger.models import Operation
from ledger.tools import get_tool
from ops import figures, rollup
from ops.models import SweepHeartbeat
from tests.ops.conftest import op_in, ops_in_every_state
from tests.review.factories import review_case

S = Operation.Status


def explorer_ids(client: Client, url: str) -> set[str]:
    html = client.get(url).content.decode()
    return set(re.findall(r'<th scope="row" class="mono"><a href="[^"]+">([^<]+)</a>', html))


def figure_value(html: str, label: str) -> int:
    match = re.search(r'<span class="figure-value">(\d+)</span><span class="figure-label">'
                      r'(?:<span class="alert-mark"[^>]*>!</span> )?' + re.escape(label), html)
    assert match, f"no figure {label!r}"
    return int(match.group(1))


def test_anonymous_visitors_are_sent_to_log_in(db: None) -> None:
    response = Client().get("/ops/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_signed_in_non_staff_users_are_refused(outsider: Any) -> None:
    client = Client()
    client.force_login(outsider)
    assert client.get("/ops/").status_code == 403
    assert client.get("/ops/operations/").status_code == 403


def test_overview_works_on_an_empty_ledger_without_prometheus(ops_client: Client) -> None:
    response = ops_client.get("/ops/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Operations overview" in html
    assert figure_value(html, "In flight past their lease") == 0
    assert "Nothing in this period yet." in html


def test_open_operations_are_counted_by_status_and_by_tool_and_provider(
        ops_client: Client, agent: Any) -> None:
    ops_in_every_state(agent, 1, 2)
    html = ops_client.get("/ops/").content.decode()
    assert figure_value(html, "Prepared now") == 2
    assert figure_value(html, "In flight now") == 2
    assert figure_value(html, "Unknown now") == 2
    row = re.search(r'<th scope="row"><a href="[^"]*tool=refund[^"]*">refund</a></th><td>sandbox'
                    r'</td><td class="num">(\d+)</td><td class="num">(\d+)</td>'
                    r'<td class="num">(\d+)</td>', html)
    assert row and row.groups() == ("2", "2", "2")


def test_in_flight_past_lease_is_a_figure_a_banner_and_a_filtered_list(
        ops_client: Client, agent: Any, frozen: Any) -> None:
    late = op_in(agent, S.IN_FLIGHT, 1)
    op_in(agent, S.IN_FLIGHT, 2)
    frozen.shift(30)
    op_in(agent, S.IN_FLIGHT, 3)  # claimed later: its lease still runs
    frozen.shift(31)  # the first two leases (60 s) have run out
    html = ops_client.get("/ops/").content.decode()
    assert figure_value(html, "In flight past their lease") == 2
    assert 'id="banner-past_lease"' in html
    assert explorer_ids(ops_client, "/ops/operations/?problem=past_lease") == {
        late.operation_id, "wf-2:invoice-2:refund-1:v1"}


def test_unknown_past_sla_uses_the_tools_sla(ops_client: Client, agent: Any,
                                             frozen: Any) -> None:
    sla = get_tool("refund", 1).unknown_sla_seconds
    overdue = op_in(agent, S.UNKNOWN, 1)
    frozen.shift(sla - 100)
    op_in(agent, S.UNKNOWN, 2)
    frozen.shift(101)
    html = ops_client.get("/ops/").content.decode()
    assert figure_value(html, "Unknown past their SLA") == 1
    assert 'id="banner-past_sla"' in html
    assert explorer_ids(ops_client, "/ops/operations/?problem=past_sla") == {overdue.operation_id}


def test_a_tool_the_catalogue_does_not_know_gets_the_default_sla(settings: Any) -> None:
    settings.LEDGER_UNKNOWN_SLA_SECONDS = 600
    assert figures.unknown_sla_seconds("retired-tool", 3) == 600


def test_unknown_past_sla_honours_the_tools_own_sla(ops_client: Client, agent: Any, frozen: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def with_short_sla(name: str, version: int | None = None) -> Any:
        return dataclasses.replace(get_tool(name, version), unknown_sla_seconds=60)

    monkeypatch.setattr(figures, "get_tool", with_short_sla)
    op_in(agent, S.UNKNOWN, 1)
    frozen.shift(61)
    assert figures.now_figures().unknown_past_sla == 1
    assert figure_value(ops_client.get("/ops/").content.decode(), "Unknown past their SLA") == 1


def test_cases_awaiting_a_person_and_past_their_review_deadline(
        ops_client: Client, agent: Any, frozen: Any, settings: Any) -> None:
    review_case(agent, 1)
    frozen.shift(settings.RECONCILIATION_REVIEW_SLA_SECONDS + 1)
    review_case(agent, 2)
    html = ops_client.get("/ops/").content.decode()
    assert figure_value(html, "Cases awaiting a person") == 2
    assert figure_value(html, "Past their review deadline") == 1
    assert 'id="banner-review_overdue"' in html
    assert "/review/?tab=breaching" in html


def test_keys_near_retention_while_unresolved(ops_client: Client, agent: Any,
                                              frozen: Any) -> None:
    near = op_in(agent, S.UNKNOWN, 1)
    op_in(agent, S.SUCCEEDED, 2)  # resolved: its key may expire, nothing to worry about
    frozen.shift(dt.timedelta(hours=22, minutes=1))  # sandbox keys live 24 h
    op_in(agent, S.UNKNOWN, 3)  # its key is fresh
    html = ops_client.get("/ops/").content.decode()
    assert figure_value(html, "Keys near provider retention") == 1
    assert 'id="banner-near_retention"' in html
    assert explorer_ids(ops_client, "/ops/operations/?problem=near_retention") == {
        near.operation_id}


def test_webhook_figure_appears_only_when_the_webhooks_model_exists(ops_client: Client) -> None:
    html = ops_client.get("/ops/").content.decode()
    if figures.webhook_delivery_model() is None:
        assert figures.webhooks_failing() is None
        assert "Webhook deliveries failing" not in html
    else:
        assert "Webhook deliveries failing" in html


def test_sweeps_that_never_finished_raise_the_sweeps_banner(ops_client: Client) -> None:
    html = ops_client.get("/ops/").content.decode()
    assert 'id="banner-sweeps"' in html
    assert "leases" in html


def test_a_finished_sweep_task_records_its_heartbeat(db: None, frozen: Any) -> None:
    from ledger.tasks import retry_unsent_operations
    from ops.tasks import rollup_stats
    from reconciliation.tasks import sweep_cases, sweep_leases

    for task in (sweep_leases, sweep_cases, retry_unsent_operations, rollup_stats):
        task.apply()
    beats = dict(SweepHeartbeat.objects.values_list("sweep", "last_finished_at"))
    assert set(beats) == {"leases", "cases", "unsent", "ops_rollup"}
    assert figures.now_figures().stale_sweeps == []
    frozen.shift(figures.sweep_stale_after() + dt.timedelta(seconds=1))
    assert {s.name for s in figures.now_figures().stale_sweeps} == set(beats)


def test_no_banner_when_nothing_is_wrong(ops_client: Client, agent: Any) -> None:
    for name in figures.SWEEPS.values():
        SweepHeartbeat.objects.create(sweep=name, last_finished_at=dt.datetime.now(dt.UTC))
    op_in(agent, S.SUCCEEDED, 1)
    html = ops_client.get("/ops/").content.decode()
    assert 'id="banner-none"' in html
    assert 'class="banner"' not in html


def test_htmx_refresh_answers_the_live_part_only(ops_client: Client) -> None:
    response = ops_client.get("/ops/?period=day", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="live"')
    assert "<html" not in html
    assert 'hx-trigger="every 30s, ops:visible"' in html
    assert "?period=day" in html
    assert response["Vary"] and "HX-Request" in response["Vary"]


def test_every_chart_has_a_title_a_description_and_a_table(
        ops_client: Client, agent: Any, frozen: Any) -> None:
    ops_in_every_state(agent, 1, 1)
    frozen.shift(120)
    rollup.rollup_until_current()
    html = ops_client.get("/ops/").content.decode()
    charts = re.findall(r'<svg class="chart"[^>]*aria-labelledby="([^ "]+) ([^"]+)"', html)
    assert len(charts) >= 4
    for title_id, desc_id in charts:
        assert f'<title id="{title_id}">' in html
        assert re.search(f'<desc id="{desc_id}">[^<]+</desc>', html)
    assert "Fresh actions: 5 in total" in html
    assert re.search(r"<th scope=\"row\">\d\d:\d\d</th><td class=\"num\">5</td>", html)
    assert "style=" not in html  # the CSP forbids inline styles
    assert "<script>" not in html


def test_the_overview_costs_the_same_number_of_queries_whatever_the_data(
        ops_client: Client, agent: Any, frozen: Any) -> None:
    def queries() -> int:
        for period in ("hour", "day", "month"):
            with CaptureQueriesContext(connection) as captured:
                assert ops_client.get(f"/ops/?period={period}").status_code == 200
        return len(captured)

    ops_in_every_state(agent, 1, 1)
    review_case(agent, 100)
    frozen.shift(120)
    rollup.rollup_until_current()
    few = queries()
    ops_in_every_state(agent, 200, 8)
    for n in range(101, 106):
        review_case(agent, n)
    frozen.shift(120)
    rollup.rollup_until_current()
    many = queries()
    assert few == many
    assert many <= 14
    assert Operation.objects.count() == 51


def test_versions_of_one_tool_are_summed_on_the_page_and_in_the_gauge(
        ops_client: Client, agent: Any) -> None:
    op_in(agent, S.UNKNOWN, 1)
    other = op_in(agent, S.UNKNOWN, 2)
    Operation.objects.filter(pk=other.pk).update(tool_version=2)  # a retired version
    html = ops_client.get("/ops/").content.decode()
    assert figure_value(html, "Unknown now") == 2
    row = re.search(r'>refund</a></th><td>sandbox</td><td class="num">0</td>'
                    r'<td class="num">0</td><td class="num">(\d+)</td>', html)
    assert row and row.group(1) == "2"
    metrics = Client().get("/metrics").content.decode()
    assert re.search(r'^ledger_operations_unresolved\{provider="sandbox",status="unknown",'
                     r'tool="refund"\} 2\.0$', metrics, re.M)
