"""Every page runs under the strict nonce CSP without a single violation: htmx loads from our
static files with its nonce and injects no inline style; nothing comes from another origin."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import pytest
from playwright.sync_api import Page

from ledger.models import AgentCredential, Operation
from reconciliation.review import services
from tests.browser.conftest import ConsoleLog
from tests.ledger.factories import in_state
from tests.review.factories import review_case

pytestmark = pytest.mark.browser
S = Operation.Status


def _visit(page: Page, url: str, origins: set[str]) -> None:
    page.on("request", lambda request: origins.add(urlparse(request.url).netloc))
    page.goto(url)
    page.wait_for_load_state("networkidle")


def _assert_clean(page: Page, url: str) -> None:
    assert page.evaluate("typeof window.htmx") == "object", f"htmx did not run on {url}"
    assert page.evaluate("document.querySelectorAll('style').length") == 0, url
    assert page.evaluate("document.querySelectorAll('[style]').length") == 0, url


def test_no_csp_violation_on_any_page(
    live_server: Any, staff_page: Any, page: Page, console: ConsoleLog, reviewer: Any,
    second_reviewer: Any, agent: AgentCredential,
) -> None:
    case = review_case(agent, 1)
    proposed = review_case(agent, 2, amount=2_000_000)
    services.case_claim(case_id=proposed.pk, user=second_reviewer)
    services.case_decide(case_id=proposed.pk, user=second_reviewer, action="confirm",
                       reason_code="other", note="seen",
                       params_hash=proposed.operation.params_hash)
    services.case_claim(case_id=case.pk, user=reviewer)
    base = live_server.url
    host = urlparse(base).netloc
    origins: set[str] = set()

    staff = staff_page(reviewer)
    staff_urls = [
        f"{base}/review/",
        f"{base}/review/?tab=second&tool=refund",
        f"{base}/review/cases/{case.pk}/",
        f"{base}/review/cases/{proposed.pk}/",
        f"{base}/ops/",
        f"{base}/ops/?period=month",
        f"{base}/ops/operations/?status=unknown",
        f"{base}/ops/operations/{case.operation_id}/",
    ]
    for url in staff_urls:
        _visit(staff, url, origins)
        _assert_clean(staff, url)
    # An htmx swap (tab switch) under the same policy.
    staff.goto(f"{base}/review/")
    staff.get_by_role("link", name="Unclaimed").click()
    staff.wait_for_url("**/review/?tab=unclaimed")

    console.watch(page)
    customer_urls = [
        f"{base}/status/{in_state(agent, status, f'wf-9:inv-9:refund-{n}:v1').status_token}/"
        for n, status in enumerate((S.PREPARED, S.UNKNOWN, S.SUCCEEDED, S.FAILED), 1)
    ]
    for url in [f"{base}/", *customer_urls]:
        _visit(page, url, origins)
        _assert_clean(page, url)
    # An htmx swap with out-of-band parts under the same policy.
    page.goto(customer_urls[1])
    with page.expect_response(lambda response: "part=check" in response.url):
        page.get_by_role("link", name="Check now").click()
    _visit(page, f"{base}/status/not-a-real-token/", origins)

    assert console.violations == [], console.violations
    errors = [m for m in console.messages
              if m.startswith("error") and "404 (Not Found)" not in m]
    assert errors == []
    assert origins == {host}  # nothing from a CDN or any other origin
