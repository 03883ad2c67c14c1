"""The review queue in a real browser: claim and confirm end to end, and four eyes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from rest_framework.test import APIClient

from ledger.models import AgentCredential, Operation
from reconciliation import transitions as case_transitions
from reconciliation.models import Case, Decision
from sandbox.testing import SandboxClient
from tests.browser.conftest import ConsoleLog, shot
from tests.conftest import refund_params, submit_body
from tests.review.factories import review_case

pytestmark = pytest.mark.browser

WIDE = {"width": 1400, "height": 1000}


def _unknown_high_value_case(api: APIClient) -> Case:
    """An agent's 2,500.00 EUR refund whose response the provider loses: unknown, with a case
    that the reconciler escalates because of its value."""
    body = submit_body("wf-90:invoice-90:refund-1:v1",
                       params=refund_params(invoice="invoice-90", amount=250_000,
                                            memo="sandbox:lose-response"))
    response = api.post("/api/v1/operations", body, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "unknown"
    case = Case.objects.get(operation__operation_id=body["operation_id"])
    return case_transitions.case_escalate(case=case, reason="high_value", actor="reconciler")


def test_staff_claims_and_confirms_a_high_value_unknown_case(
    live_server: Any, staff_page: Any, reviewer: Any, api: APIClient, sandbox: SandboxClient,
    console: ConsoleLog,
) -> None:
    case = _unknown_high_value_case(api)
    operation = case.operation
    page: Page = staff_page(reviewer)
    page.set_viewport_size(WIDE)

    page.goto(f"{live_server.url}/review/")
    row = page.locator(f"#case-row-{case.pk}")
    expect(row).to_contain_text("€2,500.00")
    expect(row).to_contain_text("High value")
    expect(row).to_contain_text("Unclaimed")
    row.get_by_role("button", name=re.compile("Claim")).click()

    # htmx swapped the row in place, announced the claim, and kept keyboard focus on the
    # row's claim/release toggle.
    expect(row).to_contain_text("You")
    expect(page.locator("#announcer")).to_contain_text(f"You hold case {case.pk}")
    assert page.evaluate("document.activeElement.id") == f"claim-toggle-{case.pk}"
    shot(page, "review-queue-claimed")

    row.get_by_role("link", name=f"Case {case.pk}").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("€2,500.00")
    expect(page.locator("#case-body")).to_contain_text("You hold this case")
    expect(page.locator("#case-body")).to_contain_text(operation.idempotency_key)
    page.get_by_label(re.compile("Confirm: it happened")).check()
    page.get_by_label("Reason", exact=True).select_option("provider_dashboard_shows_success")
    page.get_by_label("Note", exact=True).fill("Dashboard shows the refund for invoice-90.")
    page.get_by_role("button", name="Record decision").click()

    expect(page.locator("#case-body")).to_contain_text("Resolved: confirmed by staff")
    expect(page.locator("#announcer")).to_contain_text(
        "the refund is confirmed and the operation is now succeeded.")
    shot(page, "review-case-confirmed")

    operation.refresh_from_db()
    assert operation.status == Operation.Status.SUCCEEDED
    assert operation.events.last().actor == "staff:reviewer-ann"
    case.refresh_from_db()
    assert case.state == Case.State.RESOLVED and case.resolved_by == "staff:reviewer-ann"
    decision = Decision.objects.get(case=case)
    assert (decision.action, decision.status, decision.decided_by) == (
        "confirm", "applied", reviewer)
    assert sandbox.effect_counts() == {operation.operation_id: 1}  # nothing was sent again
    assert console.violations == []


def test_four_eyes_needs_two_different_staff_members(
    live_server: Any, staff_page: Any, reviewer: Any, second_reviewer: Any,
    agent: AgentCredential, console: ConsoleLog,
) -> None:
    case = review_case(agent, 91, amount=1_500_000)
    url = f"{live_server.url}/review/cases/{case.pk}/"

    ann: Page = staff_page(reviewer)
    ann.set_viewport_size(WIDE)
    ann.goto(url)
    ann.get_by_role("button", name="Claim this case").click()
    ann.get_by_label(re.compile("Reject: it did not happen")).check()
    ann.get_by_label("Reason", exact=True).select_option("provider_has_no_record")
    ann.get_by_label("Note", exact=True).fill("No refund for invoice-91 at the provider.")
    ann.get_by_role("button", name="Propose decision").click()

    approvals = ann.locator("section.approvals")
    expect(approvals).to_contain_text("1 of 2 approvals")
    expect(approvals).to_contain_text("proposed by reviewer-ann")
    expect(approvals).to_contain_text("you cannot approve it yourself")
    # The same person cannot approve, nor take the case back and keep approvers out: no
    # approval and no claim is offered to them, only withdrawing their proposal.
    expect(ann.get_by_role("button", name=re.compile("^Approve"))).to_have_count(0)
    expect(ann.get_by_role("button", name="Claim this case")).to_have_count(0)
    expect(ann.get_by_role("button", name="Withdraw my proposal")).to_be_visible()
    assert Operation.objects.get(pk=case.operation_id).status == "unknown"
    shot(ann, "review-four-eyes-proposed")

    bob: Page = staff_page(second_reviewer)
    bob.set_viewport_size(WIDE)
    bob.goto(url)
    expect(bob.locator("section.approvals")).to_contain_text("proposed by reviewer-ann")
    bob.get_by_role("button", name="Claim this case").click()
    bob.get_by_label("Your reason").select_option("provider_support_confirmed_absent")
    bob.get_by_label("Your note").fill("Provider support confirmed: no refund was made.")
    bob.get_by_role("button", name="Approve the proposal to reject it (it did not happen)").click()

    expect(bob.locator("#case-body")).to_contain_text("Resolved: rejected by staff")
    expect(bob.locator("#announcer")).to_contain_text("2 of 2 approvals")
    shot(bob, "review-four-eyes-approved")

    decisions = list(Decision.objects.filter(case=case).order_by("pk"))
    assert [(d.decided_by.username, d.status) for d in decisions] == [
        ("reviewer-ann", "applied"), ("reviewer-bob", "applied")]
    assert decisions[1].approves == decisions[0]
    operation = Operation.objects.get(pk=case.operation_id)
    assert operation.status == Operation.Status.FAILED
    assert operation.events.last().data["decided_by"] == ["reviewer-ann", "reviewer-bob"]
    assert console.violations == []


def test_queue_filters_and_tabs_live_in_the_query_string(
    live_server: Any, staff_page: Any, reviewer: Any, agent: AgentCredential,
    console: ConsoleLog,
) -> None:
    high = review_case(agent, 1, amount=300_000)
    odd = review_case(agent, 2, amount=5_000, reason="anomaly")
    page: Page = staff_page(reviewer)
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/review/")
    expect(page.locator("tbody tr")).to_have_count(2)

    page.get_by_label("Why in review").select_option("anomaly")  # htmx: no reload
    page.wait_for_url(re.compile(r"reason=anomaly"))
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator(f"#case-row-{odd.pk}")).to_be_visible()

    page.get_by_role("link", name=re.compile("^Unclaimed")).click()
    page.wait_for_url(re.compile(r"tab=unclaimed.*reason=anomaly"))
    expect(page.locator(f"#case-row-{odd.pk}")).to_be_visible()
    expect(page.locator(f"#case-row-{high.pk}")).to_have_count(0)

    page.reload()  # the query string alone rebuilds the same view
    expect(page.get_by_label("Why in review")).to_have_value("anomaly")
    expect(page.get_by_role("link", name=re.compile("^Unclaimed"))).to_have_attribute(
        "aria-current", "page")
    expect(page.locator("tbody tr")).to_have_count(1)
    assert console.violations == []
