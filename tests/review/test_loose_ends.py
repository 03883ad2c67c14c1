"""Loose ends found by using the review queue: four-eyes proposals never lock approvers out,
every deadline carries its date, the page says who holds a case, the verdict comes first, and
several rows can be claimed or released together without JavaScript."""

from __future__ import annotations

import datetime as dt
import html
import re
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledger.models import AgentCredential
from reconciliation.models import Case, CaseEvent, Decision
from reconciliation.review import services
from tests.conftest import _staff
from tests.review.conftest import logged_in
from tests.review.factories import FOUR_EYES_AMOUNT, review_case
from tests.review.test_overrides import found_match

QUEUE = reverse("review:queue")
NOON = dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.UTC)


def row_ids(page: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'id="case-row-(\d+)"', page)]


def row(page: str, case: Case) -> str:
    start = page.index(f'id="case-row-{case.pk}"')
    return page[start: page.index("</tr>", start)]


def propose(case: Case, user: Any, action: str = "confirm") -> Any:
    services.case_claim(case_id=case.pk, user=user)
    return services.case_decide(case_id=case.pk, user=user, action=action, reason_code="other",
                                note="Seen on the dashboard.",
                                params_hash=case.operation.params_hash).decision


# --- four eyes -------------------------------------------------------------------------------

def test_my_own_proposals_are_not_in_my_awaiting_second_approval_tab(
    ann: Client, bob: Client, big_case: Case, reviewer: Any
) -> None:
    propose(big_case, reviewer)

    mine = ann.get(QUEUE, {"tab": "second"}).content.decode()
    theirs = bob.get(QUEUE, {"tab": "second"}).content.decode()

    assert row_ids(mine) == [] and row_ids(theirs) == [big_case.pk]
    assert re.search(r'id="tab-second".*?<span class="tab-count">0<', mine, re.S)
    everything = ann.get(QUEUE, {"tab": "all"}).content.decode()
    assert "Your proposal: waiting for a second reviewer" in row(everything, big_case)
    assert "claim-toggle" not in row(everything, big_case)  # nothing to act on


def test_the_proposer_cannot_take_the_claim_back_while_the_proposal_waits(
    big_case: Case, reviewer: Any
) -> None:
    propose(big_case, reviewer)
    events = CaseEvent.objects.count()

    with pytest.raises(services.OwnProposalPending, match="withdraw your proposal"):
        services.case_claim(case_id=big_case.pk, user=reviewer)

    assert Case.objects.get(pk=big_case.pk).claimed_by_id is None
    assert CaseEvent.objects.count() == events


def test_an_approver_is_never_locked_out_behind_the_proposers_claim(
    big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    proposal = propose(big_case, reviewer)
    # A claim the proposer still holds (taken before this rule, or through the admin).
    Case.objects.filter(pk=big_case.pk).update(
        claimed_by=reviewer, claim_expires_at=timezone.now() + services.CLAIM_DURATION)

    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    outcome = services.decision_approve(
        decision_id=proposal.pk, user=second_reviewer, reason_code="other", note="Agreed.",
        params_hash=big_case.operation.params_hash)

    assert outcome.applied
    assert Case.objects.get(pk=big_case.pk).state == Case.State.RESOLVED


def test_a_withdrawn_proposal_leaves_the_case_free_for_everyone(
    ann: Client, big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    proposal = propose(big_case, reviewer)

    ann.post(reverse("review:withdraw", args=[proposal.pk]))  # no claim needed

    proposal.refresh_from_db()
    assert proposal.status == Decision.Status.WITHDRAWN
    assert Case.objects.get(pk=big_case.pk).claimed_by_id is None
    services.case_claim(case_id=big_case.pk, user=second_reviewer)  # nobody in the way


def test_cases_that_will_need_four_eyes_are_marked_in_the_queue_from_the_start(
    ann: Client, agent: AgentCredential
) -> None:
    small = review_case(agent, 1, amount=2500)
    big = review_case(agent, 2, amount=FOUR_EYES_AMOUNT)

    page = ann.get(QUEUE).content.decode()

    assert "Four eyes: 2 reviewers" in row(page, big)
    assert "Four eyes" not in row(page, small)


def test_the_proposal_message_reads_as_a_sentence(ann: Client, big_case: Case,
                                                  reviewer: Any) -> None:
    services.case_claim(case_id=big_case.pk, user=reviewer)

    response = ann.post(reverse("review:decide", args=[big_case.pk]), {
        "action": "confirm", "reason_code": "other", "note": "Seen it.",
        "params_hash": big_case.operation.params_hash}, follow=True)

    text = html.unescape(response.content.decode())
    assert ("Your proposal to confirm it happened is recorded (1 of 2 approvals). Because the "
            "amount is at or above the four-eyes threshold, it takes effect only when a "
            "second, different reviewer approves it.") in text
    assert "Confirm: it happened recorded" not in text


# --- deadlines and who holds the case ----------------------------------------------------

def test_every_deadline_shows_its_date(ann: Client, agent: AgentCredential,
                                       reviewer: Any) -> None:
    with time_machine.travel(NOON, tick=False):
        case = review_case(agent, 1)
        services.case_claim(case_id=case.pk, user=reviewer)
        page = html.unescape(ann.get(reverse("review:case", args=[case.pk])).content.decode())
        queue = html.unescape(ann.get(QUEUE).content.decode())

    # Key retention 24 h minus the 1 h margin; the claim 15 min; the review SLA.
    assert "Safe until 1 Dec 2026, 07:00 UTC." in page
    assert "You hold this case until <strong>30 Nov 2026, 08:15 UTC</strong>." in page
    deadline = services.when(Case.objects.get(pk=case.pk).review_deadline_at)
    assert re.match(r"\d{1,2} [A-Z][a-z]{2} 2026, \d\d:\d\d UTC$", deadline)
    assert f"({deadline})" in page
    assert deadline in row(queue, case) and "until 30 Nov 2026, 08:15 UTC" in row(queue, case)


def test_the_page_says_who_holds_the_case_and_until_when(
    ann: Client, agent: AgentCredential, second_reviewer: Any
) -> None:
    with time_machine.travel(NOON, tick=False):
        case = review_case(agent, 1)
        services.case_claim(case_id=case.pk, user=second_reviewer)
        page = ann.get(reverse("review:case", args=[case.pk])).content.decode()

    assert ("reviewer-bob holds this case until 30 Nov 2026, 08:15 UTC, so only they can "
            "record a decision now.") in page
    assert "Claim the case to record a decision" not in page


def test_another_approver_sees_who_holds_the_case_instead_of_claim_advice(
    big_case: Case, reviewer: Any, second_reviewer: Any, django_user_model: Any
) -> None:
    propose(big_case, second_reviewer)
    with time_machine.travel(NOON, tick=False):
        services.case_claim(case_id=big_case.pk, user=reviewer)
        carol = logged_in(_staff(django_user_model, "reviewer-carol", review=True))
        page = carol.get(reverse("review:case", args=[big_case.pk])).content.decode()

    assert ("reviewer-ann holds the case until 30 Nov 2026, 08:15 UTC; you can approve or "
            "decline once they release it or the claim expires.") in page
    assert "Claim the case to approve" not in page


# --- the verdict and the raw evidence ------------------------------------------------------

def test_the_case_page_opens_with_a_one_line_verdict(ann: Client, agent: AgentCredential) -> None:
    with time_machine.travel(dt.datetime(2026, 11, 30, 9, 0, 36, tzinfo=dt.UTC), tick=False):
        case = review_case(agent, 1)
        found_match(case)
    page = html.unescape(ann.get(reverse("review:case", args=[case.pk])).content.decode())

    verdict = page.index('id="verdict"')
    assert verdict < page.index('class="case-badges"') < page.index('class="case-grid"')
    assert ("The provider has a matching refund — lookup at 09:00:36 UTC on 30 Nov 2026, all "
            "intent fields equal: the evidence supports Confirm.") in page


def test_without_an_answer_the_verdict_says_the_evidence_supports_neither(
    ann: Client, case: Case
) -> None:
    page = html.unescape(ann.get(reverse("review:case", args=[case.pk])).content.decode())

    assert "Nobody has asked the provider about this refund yet" in page
    assert "verdict-neither" in page


def test_raw_request_and_answer_span_the_whole_evidence_table(ann: Client, case: Case) -> None:
    evidence = found_match(case)

    page = ann.get(reverse("review:case", args=[case.pk])).content.decode()

    raw = page[page.index(f'id="evidence-{evidence.pk}"'):]
    raw = raw[raw.index('<tr class="raw-row">'):]
    assert raw.index('<td colspan="4">') < raw.index('<pre class="json">') < raw.index("</tr>")


# --- several rows at once, keyboard ----------------------------------------------------------

def test_claim_and_release_several_rows_with_a_plain_form(
    ann: Client, agent: AgentCredential, reviewer: Any, second_reviewer: Any
) -> None:
    first, second, taken = (review_case(agent, n) for n in (1, 2, 3))
    services.case_claim(case_id=taken.pk, user=second_reviewer)

    response = ann.post(reverse("review:bulk"), {
        "action": "claim", "case": [first.pk, second.pk, taken.pk], "next": QUEUE},
        follow=True)

    text = html.unescape(response.content.decode())
    assert f"You now hold cases {first.pk}, {second.pk}." in text
    assert f"Case {taken.pk}: reviewer-bob is working on this case" in text
    held = dict(Case.objects.values_list("pk", "claimed_by__username"))
    assert held == {first.pk: "reviewer-ann", second.pk: "reviewer-ann",
                    taken.pk: "reviewer-bob"}

    ann.post(reverse("review:bulk"), {"action": "release", "case": [first.pk, second.pk]})

    assert not Case.objects.filter(claimed_by=reviewer).exists()


def test_bulk_without_ticked_rows_changes_nothing(ann: Client, case: Case) -> None:
    events = CaseEvent.objects.count()

    response = ann.post(reverse("review:bulk"), {"action": "claim"}, follow=True)

    assert "Tick at least one case" in response.content.decode()
    assert CaseEvent.objects.count() == events


def test_queue_has_a_skip_link_row_checkboxes_and_a_shortcut_list(ann: Client,
                                                                  case: Case) -> None:
    page = ann.get(QUEUE).content.decode()

    assert '<a class="skip-link" href="#queue-results">Skip to results</a>' in page
    assert f'form="bulk-form" id="select-{case.pk}"' in page
    assert '<dialog id="shortcuts" aria-labelledby="shortcuts-heading">' in page
    assert re.search(r'<script src="/static/js/queue\.js" nonce="[^"]+" defer></script>', page)
    assert "<script>" not in page
