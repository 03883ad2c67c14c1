"""The trust items in a real browser: the queue on a phone and from the keyboard, several rows
at once, the case page's verdict and raw evidence, amounts typed in zero- and three-decimal
currencies, the customer's page with and without JavaScript, and admin changelists that fit."""

from __future__ import annotations

import datetime as dt
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from ledger.models import AgentCredential, Operation
from reconciliation.models import Case, Decision
from reconciliation.review import services
from tests.browser.conftest import ConsoleLog
from tests.browser.conftest import shot as _shot
from tests.ledger.factories import in_state
from tests.review.factories import FOUR_EYES_AMOUNT, review_case, unknown_operation
from tests.review.test_overrides import found_match

pytestmark = pytest.mark.browser

WIDE = {"width": 1400, "height": 1000}
PHONE = {"width": 375, "height": 812}
ADMIN = {"width": 1280, "height": 900}


SHOTS = Path("/tmp/shots-trustui")  # outside the repository; opened and checked by hand


def shot(page: Page, name: str) -> Path:
    path = _shot(page, name)
    SHOTS.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(path, SHOTS / path.name))


def _queue_with_cases(agent: AgentCredential, second_reviewer: Any) -> list[Case]:
    cases = [
        review_case(agent, 1, amount=2500, currency="JPY"),
        review_case(agent, 2, amount=2500, currency="KWD"),
        review_case(agent, 3, amount=FOUR_EYES_AMOUNT, reason="anomaly"),
        review_case(agent, 4, amount=1234, payee="cus_with_a_rather_long_customer_reference_9"),
    ]
    services.case_claim(case_id=cases[3].pk, user=second_reviewer)
    return cases


def no_sideways_scroll(page: Page, width: int) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert page.evaluate("document.body.scrollWidth") <= width


def test_queue_fits_a_375_pixel_phone_and_a_desktop(
    live_server: Any, staff_page: Any, reviewer: Any, second_reviewer: Any,
    agent: AgentCredential, console: ConsoleLog,
) -> None:
    cases = _queue_with_cases(agent, second_reviewer)
    page: Page = staff_page(reviewer)

    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/review/")
    expect(page.locator(f"#case-row-{cases[0].pk}")).to_contain_text("¥2,500")
    expect(page.locator(f"#case-row-{cases[1].pk}")).to_contain_text("2.500\u00a0KWD")
    expect(page.locator(f"#case-row-{cases[2].pk}")).to_contain_text("Four eyes")
    no_sideways_scroll(page, WIDE["width"])
    shot(page, "queue-desktop")

    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/review/")
    expect(page.locator(f"#case-row-{cases[0].pk}")).to_be_visible()
    no_sideways_scroll(page, PHONE["width"])
    for row in page.locator("tr[id^='case-row-']").all():
        box = row.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    shot(page, "queue-375")
    assert console.violations == []


def test_queue_keyboard_skip_link_j_k_enter_c_and_shortcut_list(
    live_server: Any, staff_page: Any, reviewer: Any, second_reviewer: Any,
    agent: AgentCredential, console: ConsoleLog,
) -> None:
    cases = _queue_with_cases(agent, second_reviewer)
    page: Page = staff_page(reviewer)
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/review/")

    # The skip link is the first thing Tab reaches after "Skip to content", and it moves focus
    # past the filters to the results.
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to results")
    page.keyboard.press("Enter")
    assert page.evaluate("location.hash") == "#queue-results"

    ordered = [int(row.get_attribute("id").split("-")[-1])  # type: ignore[union-attr]
               for row in page.locator("tr[id^='case-row-']").all()]
    assert sorted(ordered) == sorted(case.pk for case in cases)
    page.locator("body").focus()
    page.keyboard.press("j")
    expect(page.locator(f"#case-row-{ordered[0]}")).to_have_attribute("aria-current", "true")
    page.keyboard.press("j")
    page.keyboard.press("k")
    expect(page.locator(f"#case-row-{ordered[0]}")).to_have_attribute("aria-current", "true")
    expect(page.locator(":focus")).to_have_text(f"Case {ordered[0]}")

    # c claims the selected row in place (htmx), and it stays selected.
    unclaimed = next(pk for pk in ordered if pk != cases[3].pk)
    while page.locator(f"#case-row-{unclaimed}").get_attribute("aria-current") != "true":
        page.keyboard.press("j")
    page.keyboard.press("c")
    expect(page.locator(f"#case-row-{unclaimed}")).to_contain_text("You")
    expect(page.locator("#announcer")).to_contain_text(f"You hold case {unclaimed} until")
    assert Case.objects.get(pk=unclaimed).claimed_by == reviewer

    # ? opens an accessible list of the shortcuts; Escape closes it.
    page.locator("body").focus()
    page.keyboard.press("?")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Next case")
    shot(page, "queue-shortcuts")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    # Enter opens the selected case.
    page.locator(f"#case-row-{unclaimed} a.case-link").focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"/review/cases/{unclaimed}/$"))
    assert console.violations == []


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
def test_claim_and_release_several_rows_together(
    javascript: bool, live_server: Any, browser: Any, reviewer: Any, second_reviewer: Any,
    agent: AgentCredential,
) -> None:
    from tests.browser.conftest import session_cookie

    cases = _queue_with_cases(agent, second_reviewer)
    context = browser.new_context(java_script_enabled=javascript)
    context.add_cookies([session_cookie(reviewer, live_server.url)])
    page = context.new_page()
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/review/")

    page.get_by_label(f"Select case {cases[0].pk}").check()
    page.get_by_label(f"Select case {cases[1].pk}").check()
    page.get_by_role("button", name="Claim", exact=True).first.click()

    expect(page.locator("#announcer")).to_contain_text(
        f"You now hold cases {min(cases[0].pk, cases[1].pk)}, {max(cases[0].pk, cases[1].pk)}.")
    held = set(Case.objects.filter(claimed_by=reviewer).values_list("pk", flat=True))
    assert held == {cases[0].pk, cases[1].pk}

    page.get_by_label(f"Select case {cases[0].pk}").check()
    page.get_by_label(f"Select case {cases[1].pk}").check()
    page.locator("#bulk-release").click()
    expect(page.locator("#announcer")).to_contain_text("You released cases")
    assert not Case.objects.filter(claimed_by=reviewer).exists()
    context.close()


def test_case_page_opens_with_the_verdict_and_shows_raw_json_at_full_width(
    live_server: Any, staff_page: Any, reviewer: Any, agent: AgentCredential,
    console: ConsoleLog,
) -> None:
    case = review_case(agent, 5, amount=250_000)
    evidence = found_match(case)
    services.case_claim(case_id=case.pk, user=reviewer)
    page: Page = staff_page(reviewer)
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/review/cases/{case.pk}/")

    verdict = page.locator("#verdict")
    expect(verdict).to_contain_text("The provider has a matching refund — lookup at")
    expect(verdict).to_contain_text("the evidence supports Confirm.")
    verdict_box = verdict.bounding_box()
    grid_box = page.locator(".case-grid").bounding_box()
    assert verdict_box and grid_box and verdict_box["y"] < grid_box["y"]

    assert console.violations == [], "load"
    raw_row = page.locator(f"#evidence-{evidence.pk} + tr.raw-row")
    raw_row.get_by_text("Request and answer (raw JSON)").click()
    table = page.locator("section[aria-labelledby=lookups-heading] table").bounding_box()
    details = raw_row.locator("details").bounding_box()
    assert table and details and details["width"] >= table["width"] * 0.9
    shot(page, "case-page")
    assert console.violations == [], "details"

    # Rejecting against that evidence is refused until it is marked as an override.
    page.get_by_label(re.compile("Reject: it did not happen")).check()
    page.get_by_label("Reason", exact=True).select_option("provider_has_no_record")
    page.get_by_label("Note", exact=True).fill("The customer says no money arrived.")
    page.get_by_role("button", name="Record decision").click()
    expect(page.locator("#announcer")).to_contain_text("Rejecting contradicts the evidence")
    assert console.violations == [], "refused"
    assert Decision.objects.count() == 0
    page.get_by_label("I am deciding against the provider's evidence (override)").check()
    page.get_by_label("Why the evidence is wrong").fill("The match is a refund to another card.")
    page.get_by_role("button", name="Record decision").click()
    expect(page.locator("section.approvals")).to_contain_text("Override:")
    assert Decision.objects.get().overrides_evidence == evidence
    shot(page, "case-page-override-proposed")
    assert console.violations == []


@pytest.mark.parametrize(("currency", "typed", "wrong", "message"), [
    ("JPY", "2,500", "25.00", "JPY amounts have no decimals."),
    ("KWD", "2.500", "2,500", "You typed 2,500.000\u00a0KWD, but the intent is 2.500\u00a0KWD"),
])
def test_decision_form_reads_amounts_with_the_currency_exponent(
    currency: str, typed: str, wrong: str, message: str, live_server: Any, staff_page: Any,
    reviewer: Any, agent: AgentCredential, console: ConsoleLog,
) -> None:
    case = review_case(agent, 6, amount=2500, currency=currency)
    services.case_claim(case_id=case.pk, user=reviewer)
    page: Page = staff_page(reviewer)
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/review/cases/{case.pk}/")
    expect(page.get_by_role("heading", level=1)).to_contain_text(
        "¥2,500" if currency == "JPY" else "2.500\u00a0KWD")

    page.get_by_label(re.compile("Confirm: it happened")).check()
    page.get_by_label("Reason", exact=True).select_option("provider_dashboard_shows_success")
    page.get_by_label("Note", exact=True).fill("Provider dashboard shows it.")
    amount = page.get_by_label(f"Amount you checked, in {currency} (optional)")
    amount.fill(wrong)
    page.get_by_role("button", name="Record decision").click()
    expect(page.locator("#case-body")).to_contain_text(message)
    assert Operation.objects.get(pk=case.operation_id).status == Operation.Status.UNKNOWN

    page.get_by_label(f"Amount you checked, in {currency} (optional)").fill(typed)
    page.get_by_role("button", name="Record decision").click()
    expect(page.locator("#case-body")).to_contain_text("Resolved: confirmed by staff")
    assert Decision.objects.get().amount_checked == 2500
    assert console.violations == []


@pytest.mark.parametrize(("currency", "shown"), [("JPY", "¥2,500"), ("KWD", "2.500\u00a0KWD")])
def test_status_page_shows_zero_and_three_decimal_amounts(
    currency: str, shown: str, live_server: Any, page: Page, agent: AgentCredential,
) -> None:
    operation = in_state(agent, Operation.Status.SUCCEEDED, amount=2500, currency=currency)

    page.goto(f"{live_server.url}/status/{operation.status_token}/")

    expect(page.locator("#status-details")).to_contain_text(shown)


def test_status_page_without_javascript_offers_only_the_refresh_link(
    live_server: Any, browser: Any, agent: AgentCredential,
) -> None:
    operation = unknown_operation(agent, "wf-7:invoice-7:refund-1:v1")
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/status/{operation.status_token}/")

    expect(page.get_by_role("status")).to_contain_text("Not yet confirmed")
    expect(page.get_by_text("updates by itself")).to_be_hidden()
    expect(page.get_by_role("link", name="Pause updates")).to_have_count(0)
    expect(page.get_by_role("link", name="Check now")).to_be_visible()
    expect(page.locator("#expected-by")).to_contain_text("We expect to confirm this by")
    expect(page.locator(".local-time")).to_have_count(0)
    expect(page.locator("#org-contact")).to_be_visible()
    assert operation.operation_id not in page.content()
    shot(page, "status-375-no-js")
    context.close()


def test_status_page_with_javascript_updates_itself_and_shows_local_time(
    live_server: Any, browser: Any, agent: AgentCredential, console: ConsoleLog,
) -> None:
    operation = unknown_operation(agent, "wf-8:invoice-8:refund-1:v1")
    case = Case.objects.get(operation=operation)
    context = browser.new_context(timezone_id="Europe/Berlin")
    page = console.watch(context.new_page())
    page.set_viewport_size(PHONE)
    page.goto(f"{live_server.url}/status/{operation.status_token}/")

    expect(page.get_by_text(re.compile("This page updates by itself"))).to_be_visible()
    expect(page.get_by_role("link", name="Pause updates")).to_be_visible()
    expect(page.locator("#expected-by .local-time")).to_contain_text("Europe/Berlin")
    no_sideways_scroll(page, PHONE["width"])
    shot(page, "status-375-js")

    # A later check shows up on the next poll.
    later = timezone.now() + dt.timedelta(minutes=2)
    Case.objects.filter(pk=case.pk).update(last_checked_at=later)
    expect(page.locator("#last-checked")).to_contain_text(
        timezone.localtime(later).strftime("%H:%M:%S"), timeout=10_000)
    expect(page.locator("#last-checked + .local-time")).to_contain_text("Europe/Berlin")
    assert console.violations == []
    context.close()


def test_admin_changelists_fit_1280_pixels(
    live_server: Any, staff_page: Any, admin_user: Any, reviewer: Any, second_reviewer: Any,
    agent: AgentCredential, console: ConsoleLog,
) -> None:
    _queue_with_cases(agent, second_reviewer)
    in_state(agent, Operation.Status.SUCCEEDED,
             operation_id="workflow-2026-11-30-customer-care:invoice-100234:refund-12:v1")
    page: Page = staff_page(admin_user)
    page.set_viewport_size(ADMIN)
    for path, name in (("ledger/operation", "admin-operations"),
                       ("reconciliation/case", "admin-cases")):
        page.goto(f"{live_server.url}/admin/{path}/")
        table = page.locator("#result_list")
        expect(table).to_be_visible()
        width = page.evaluate("document.querySelector('#result_list').scrollWidth")
        container = page.evaluate(
            "document.querySelector('#result_list').parentElement.clientWidth")
        assert width <= container, (path, width, container)
        no_sideways_scroll(page, ADMIN["width"])
        shot(page, name)
    page.goto(f"{live_server.url}/admin/reconciliation/case/")
    filters = page.locator("#changelist-filter")
    expect(filters).to_contain_text("Provider record differs")  # not "anomaly"
    expect(filters).not_to_contain_text("high_value")
    case = Case.objects.order_by("pk").first()
    assert case is not None
    page.goto(f"{live_server.url}/admin/reconciliation/case/{case.pk}/change/")
    expect(page.locator("h2, h1").first).to_be_visible()
    assert "Case for refund" in page.title() or "Case for refund" in page.content()
    assert "(awaiting_review)" not in page.content()
