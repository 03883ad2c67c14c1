"""The operators' dashboard in a real browser: the overview with its charts and their text
alternatives, the explorer, an operation's page, at desktop width and at 375 px."""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from ledger.models import AgentCredential, Operation
from ops import rollup
from tests.browser.conftest import SHOTS, ConsoleLog, shot
from tests.ops.conftest import op_in, ops_in_every_state
from tests.review.factories import review_case

pytestmark = pytest.mark.browser

WIDE = {"width": 1400, "height": 1000}
PHONE = {"width": 375, "height": 812}
S = Operation.Status


def busy_ledger(agent: AgentCredential) -> None:
    """Operations in every state, a case in review, and an hour of counters behind the charts."""
    ops_in_every_state(agent, 1, 2)
    review_case(agent, 50)
    rng = random.Random(12)
    now = dt.datetime.now(dt.UTC)
    facts = []
    for minute in range(60):
        at = now - dt.timedelta(minutes=minute)
        facts += [rollup.Fact(at, "fresh", "refund", "sandbox", count=rng.randint(5, 30)),
                  rollup.Fact(at, "replay", "refund", "sandbox", count=rng.randint(0, 12)),
                  rollup.Fact(at, "conflict", "refund", "sandbox", count=rng.randint(0, 2))]
        if minute % 4 == 0:
            facts += [rollup.Fact(at, "unknown_opened", "refund", "sandbox", count=2),
                      rollup.Fact(at, "unknown_ended", "refund", "sandbox", "proven_succeeded"),
                      rollup.Fact(at, "unknown_ended", "refund", "sandbox", "person"),
                      rollup.Fact(at, "resolution", "refund", "sandbox", "300", total=240.0),
                      rollup.Fact(at, "resolution", "refund", "sandbox", "3600", total=2000.0)]
        for provider, bound in (("sandbox", "0.1"), ("stripe-sandbox", "0.25")):
            facts += [rollup.Fact(at, "provider_call", "", provider, "succeeded", count=9),
                      rollup.Fact(at, "provider_latency", "", provider, bound, count=9,
                                  total=9 * float(bound) * 0.7),
                      rollup.Fact(at, "provider_latency", "", provider, "1", count=1, total=0.8),
                      rollup.Fact(at, "provider_call", "", provider, "unknown", count=1),
                      rollup.Fact(at, "provider_error", "", provider, "transport.ReadTimeout")]
    rollup.add(facts)


def test_overview_shows_figures_banners_and_charts_with_text_alternatives(
        live_server: Any, staff_page: Any, reviewer: Any, agent: AgentCredential,
        console: ConsoleLog) -> None:
    busy_ledger(agent)
    page: Page = staff_page(reviewer)
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/ops/")

    expect(page.get_by_role("heading", name="Operations overview")).to_be_visible()
    expect(page.locator("#banner-sweeps")).to_contain_text("Sweeps not running")
    expect(page.get_by_role("link", name=re.compile("Unknown now"))).to_contain_text("3")

    chart = page.get_by_role("img", name=re.compile("Fresh actions, replays and params conflicts"))
    expect(chart).to_be_visible()
    description = page.locator("#chart-actions-desc")
    expect(description).to_contain_text("Last hour, by minute")
    expect(description).to_contain_text("Fresh actions:")
    card = page.locator("#chart-actions")
    SHOTS.mkdir(parents=True, exist_ok=True)
    for key in ("chart-actions", "chart-unknown-ended", "chart-resolution", "chart-latency-0"):
        page.locator(f"#{key}").screenshot(path=str(SHOTS / f"ops-{key}.png"))
    page.locator("table.providers").screenshot(path=str(SHOTS / "ops-providers.png"))
    card.get_by_text("Numbers behind this chart").click()
    table = card.get_by_role("table")
    expect(table).to_be_visible()
    assert table.locator("tbody tr").count() >= 55
    expect(card.locator(".legend")).to_contain_text("Params conflicts")
    expect(page.locator("table.providers")).to_contain_text("transport.ReadTimeout")
    shot(page, "ops-overview-desktop")

    page.get_by_role("link", name="Last day, by hour").click()
    expect(page).to_have_url(re.compile(r"period=day"))
    expect(page.locator("#period-day")).to_have_attribute("aria-current", "page")
    expect(page.locator("#chart-actions-desc")).to_contain_text("Last day, by hour")
    assert console.violations == []


def test_overview_refreshes_when_the_tab_becomes_visible_again(
        live_server: Any, staff_page: Any, reviewer: Any, console: ConsoleLog) -> None:
    page: Page = staff_page(reviewer)
    page.goto(f"{live_server.url}/ops/")
    expect(page.locator("#live")).to_be_visible()
    with page.expect_request(lambda r: "/ops/" in r.url and r.headers.get("hx-request") == "true"):
        page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
    assert console.violations == []


def test_overview_skips_its_poll_while_the_tab_is_hidden(
        live_server: Any, staff_page: Any, reviewer: Any) -> None:
    page: Page = staff_page(reviewer)
    page.goto(f"{live_server.url}/ops/")
    expect(page.locator("#live")).to_be_visible()
    # A poll as htmx issues it (no triggering event), with the tab hidden and then visible.
    cancelled = page.evaluate("""() => {
        const live = document.getElementById("live");
        const poll = () => {
            const event = new CustomEvent("htmx:beforeRequest", {bubbles: true, cancelable: true,
                detail: {elt: live, requestConfig: {triggeringEvent: null}}});
            live.dispatchEvent(event);
            return event.defaultPrevented;
        };
        const hidden = () => "hidden";
        Object.defineProperty(document, "visibilityState", {get: hidden, configurable: true});
        const whileHidden = poll();
        Object.defineProperty(document, "visibilityState", {get: () => "visible",
                                                            configurable: true});
        return [whileHidden, poll()];
    }""")
    assert cancelled == [True, False]


def test_overview_at_375_pixels_has_no_horizontal_scroll(
        live_server: Any, staff_page: Any, reviewer: Any, agent: AgentCredential,
        console: ConsoleLog) -> None:
    busy_ledger(agent)
    page: Page = staff_page(reviewer)
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/ops/")
    expect(page.get_by_role("img", name=re.compile("Unknown outcomes opened"))).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    box = page.locator("#chart-actions svg.chart").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    shot(page, "ops-overview-375")
    assert console.violations == []


def test_explorer_searches_filters_and_opens_an_operation(
        live_server: Any, staff_page: Any, reviewer: Any, agent: AgentCredential,
        console: ConsoleLog) -> None:
    ops_in_every_state(agent, 1, 3)
    case = review_case(agent, 40, card_token="tok_browser_secret")
    page: Page = staff_page(reviewer)
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/ops/operations/")
    rows = page.locator("table.operations tbody tr")
    expect(rows).to_have_count(16)

    page.get_by_label("Status").select_option("unknown")
    expect(rows).to_have_count(4)
    expect(page).to_have_url(re.compile(r"status=unknown"))
    page.get_by_role("searchbox", name="Search").fill("invoice-40")
    page.get_by_role("button", name="Search").click()
    expect(rows).to_have_count(1)
    shot(page, "ops-explorer-desktop")

    rows.get_by_role("link").click()
    expect(page.get_by_role("heading", name=case.operation.operation_id)).to_be_visible()
    expect(page.locator("body")).not_to_contain_text("tok_browser_secret")
    expect(page.get_by_role("link", name=f"Case {case.pk}")).to_have_attribute(
        "href", f"/review/cases/{case.pk}/")
    expect(page.get_by_role("link", name="Customer's status page")).to_be_visible()
    shot(page, "ops-operation-desktop")
    assert console.violations == []


def test_explorer_and_operation_page_at_375_pixels(
        live_server: Any, staff_page: Any, reviewer: Any, agent: AgentCredential,
        console: ConsoleLog) -> None:
    ops_in_every_state(agent, 1, 2)
    operation = op_in(agent, S.UNKNOWN, 30)
    page: Page = staff_page(reviewer)
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/ops/operations/")
    expect(page.locator("table.operations tbody tr")).to_have_count(11)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "ops-explorer-375")
    page.goto(f"{live_server.url}/ops/operations/{operation.pk}/")
    expect(page.get_by_role("heading", name="Attempts")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    # The worker name ("By") keeps a readable width; the table scrolls inside its wrapper.
    by_width = page.evaluate("document.querySelector('table.attempts td.mono')"
                             ".getBoundingClientRect().width")
    assert by_width >= 150
    shot(page, "ops-operation-375")
    assert console.violations == []
