"""The customer's status page in a real browser: it updates by itself, stops at the end, can
be paused, and reads on a phone."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from playwright.sync_api import Page, Request, expect
from rest_framework.test import APIClient

from ledger.models import AgentCredential, Operation
from reconciliation import services
from reconciliation.models import Case
from sandbox.testing import SandboxClient
from tests.browser.conftest import ConsoleLog, shot
from tests.conftest import refund_params, submit_body
from tests.ledger.factories import in_state

pytestmark = pytest.mark.browser

PHONE = {"width": 375, "height": 812}
UNKNOWN_WORDS = (
    "We can't confirm yet whether your refund went through. We're checking with the payment "
    "provider. You don't need to do anything, and please don't request it again."
)


def _lost_response_refund(api: APIClient) -> Operation:
    """The provider refunds, the answer is lost: the operation is unknown and a case opens."""
    body = submit_body("wf-70:invoice-70:refund-1:v1",
                       params=refund_params(invoice="invoice-70", memo="sandbox:lose-response"))
    response = api.post("/api/v1/operations", body, format="json")
    assert response.json()["status"] == "unknown"
    return Operation.objects.get(operation_id=body["operation_id"])


def test_status_page_shows_not_yet_confirmed_and_completes_by_itself(
    live_server: Any, page: Page, api: APIClient, sandbox: SandboxClient, console: ConsoleLog,
) -> None:
    operation = _lost_response_refund(api)
    console.watch(page)
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if r.headers.get("hx-request") else None)

    page.goto(f"{live_server.url}/status/{operation.status_token}/")
    region = page.get_by_role("status")
    expect(region).to_have_count(1)
    expect(region).to_contain_text("Not yet confirmed")
    expect(region).to_contain_text(UNKNOWN_WORDS)
    expect(page.locator("#status-details")).to_contain_text("Last checked")
    assert "fail" not in page.content().lower()
    page.evaluate("window.__sameDocument = true")
    shot(page, "status-not-yet-confirmed")

    # Reconciliation resolves it while the page is open (the reconciler's same-key re-send
    # gets the provider's stored answer back), in another thread like a worker would.
    case = Case.objects.get(operation=operation)
    worker = threading.Thread(target=services.reconcile_case_now, kwargs={"case_id": case.pk})
    worker.start()
    worker.join()
    operation.refresh_from_db()
    assert operation.status == Operation.Status.SUCCEEDED

    expect(region).to_contain_text("Completed", timeout=15_000)
    expect(region).to_contain_text("Your refund went through.")
    expect(region).to_contain_text(operation.provider_request_id)
    expect(page.locator("#status-poller")).to_contain_text("no longer updates")
    assert page.evaluate("window.__sameDocument") is True  # updated in place, not reloaded
    assert len(polls) >= 1

    # Terminal: polling has stopped.
    seen = len(polls)
    page.wait_for_timeout(2500)
    assert len(polls) == seen
    assert sandbox.effect_counts() == {operation.operation_id: 1}
    assert console.violations == []
    shot(page, "status-completed")


def test_status_page_pause_and_check_now(
    live_server: Any, page: Page, agent: AgentCredential, console: ConsoleLog
) -> None:
    operation = in_state(agent, Operation.Status.UNKNOWN)
    console.watch(page)
    requests: list[Request] = []
    page.on("request", lambda r: requests.append(r) if r.headers.get("hx-request") else None)
    page.goto(f"{live_server.url}/status/{operation.status_token}/")

    page.get_by_role("link", name="Pause updates").click()
    expect(page.locator("#status-poller")).to_contain_text("Automatic updates are paused.")
    # Focus stays on the toggle the customer just used.
    assert page.evaluate("document.activeElement.id") == "poll-toggle"
    paused_at = len(requests)
    page.wait_for_timeout(3000)
    assert len(requests) == paused_at  # nothing polls while paused

    page.get_by_role("link", name="Check now").click()
    expect(page.get_by_role("status")).to_contain_text("Not yet confirmed")
    assert any("part=check" in r.url for r in requests)
    expect(page.locator("#status-poller")).to_contain_text("Automatic updates are paused.")

    page.get_by_role("link", name="Resume updates").click()
    expect(page.locator("#status-poller")).to_contain_text("This page updates by itself")
    resumed_at = len(requests)
    page.wait_for_timeout(2600)
    assert len(requests) > resumed_at
    assert console.violations == []


def test_status_page_works_without_javascript(
    live_server: Any, browser: Any, agent: AgentCredential
) -> None:
    operation = in_state(agent, Operation.Status.UNKNOWN)
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    url = f"{live_server.url}/status/{operation.status_token}/"
    page.goto(url)
    expect(page.get_by_role("status")).to_contain_text("Not yet confirmed")
    expect(page.locator("noscript")).to_have_count(1)

    from ledger import transitions

    transitions.operation_succeed(operation=operation, fencing_token=None, result={"id": "r"},
                                  provider_request_id="re_555", actor="t", reason="t")
    page.get_by_role("link", name="Check now").click()  # a plain link: reloads the page
    expect(page.get_by_role("status")).to_contain_text("Completed")
    expect(page.get_by_role("status")).to_contain_text("re_555")
    context.close()


def test_status_page_at_375_pixels_wide(
    live_server: Any, page: Page, agent: AgentCredential, console: ConsoleLog
) -> None:
    console.watch(page)
    page.set_viewport_size(PHONE)
    for number, status in enumerate((Operation.Status.UNKNOWN, Operation.Status.FAILED), 1):
        operation = in_state(agent, status, operation_id=f"wf-3:invoice-3:refund-{number}:v1")
        page.goto(f"{live_server.url}/status/{operation.status_token}/")
        expect(page.get_by_role("heading", level=1)).to_be_visible()

        # Nothing wider than the phone: no sideways scrolling.
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        # Body text large enough to read, buttons large enough to tap.
        lead_size = page.evaluate(
            "parseFloat(getComputedStyle(document.querySelector('.state-lead')).fontSize)")
        assert lead_size >= 16
        for link in page.locator(".controls .button").all():
            box = link.bounding_box()
            assert box is not None and box["height"] >= 40 and box["x"] + box["width"] <= 375
        shot(page, f"status-375-{status}")
    assert console.violations == []


def test_status_colour_is_never_the_only_signal_and_unknown_is_not_red(
    live_server: Any, page: Page, agent: AgentCredential
) -> None:
    operation = in_state(agent, Operation.Status.UNKNOWN)
    page.goto(f"{live_server.url}/status/{operation.status_token}/")

    heading = page.get_by_role("heading", level=1)
    expect(heading).to_have_text(re.compile(r"\s*Not yet confirmed\s*"))
    expect(page.locator(".state-icon")).to_have_count(1)
    colour = page.evaluate(
        "getComputedStyle(document.querySelector('.state-heading')).color")
    red, green, blue = (int(part) for part in re.findall(r"\d+", colour)[:3])
    assert not (red > 150 and green < 100 and blue < 100), colour
