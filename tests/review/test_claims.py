"""Claims: exclusive, expiring, enforced on the server; conflicts say who holds the case and
change nothing."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from reconciliation import transitions as case_transitions
from reconciliation.models import Case, CaseEvent
from reconciliation.review import services
from tests.conftest import requires_postgres

HX = {"HTTP_HX_REQUEST": "true"}


def claim_url(case: Case) -> str:
    return reverse("review:claim", args=[case.pk])


def release_url(case: Case) -> str:
    return reverse("review:release", args=[case.pk])


def claim_events(case: Case) -> list[str]:
    return list(case.events.filter(reason__in=["claimed", "claim_released"])
                .values_list("reason", flat=True))


def test_claim_from_the_case_page_without_js_redirects_back(
    ann: Client, case: Case, reviewer: Any
) -> None:
    response = ann.post(claim_url(case))

    assert response.status_code == 302
    assert response["Location"] == reverse("review:case", args=[case.pk])
    case.refresh_from_db()
    assert case.claimed_by == reviewer
    left = case.claim_expires_at - timezone.now()
    assert dt.timedelta(minutes=14) < left <= services.CLAIM_DURATION
    event = case.events.get(reason="claimed")
    assert event.actor == "staff:reviewer-ann"
    assert event.from_state == event.to_state == "awaiting_review"
    followed = ann.get(response["Location"]).content.decode()
    assert "You hold case" in followed and "Release" in followed


def test_claim_with_htmx_swaps_the_case_body_and_announces(
    ann: Client, case: Case, reviewer: Any
) -> None:
    response = ann.post(claim_url(case), **HX)

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="case-body"')
    assert 'id="announcer" hx-swap-oob="innerHTML"' in html
    assert "You hold case" in html
    assert "Record decision" in html


def test_claim_from_a_queue_row_with_htmx_swaps_only_the_row(
    ann: Client, case: Case
) -> None:
    response = ann.post(claim_url(case), {"from": "queue", "next": "/review/?tab=all"}, **HX)

    html = response.content.decode()
    assert html.lstrip().startswith(f'<tr id="case-row-{case.pk}"')
    assert "Release" in html and ">You<" in html
    assert "<template>" in html and "You hold case" in html


def test_claim_from_a_queue_row_without_js_returns_to_the_list(
    ann: Client, case: Case
) -> None:
    response = ann.post(claim_url(case), {"from": "queue", "next": "/review/?tab=unclaimed"})

    assert response.status_code == 302
    assert response["Location"] == "/review/?tab=unclaimed"


def test_next_must_stay_on_this_site(ann: Client, case: Case) -> None:
    response = ann.post(claim_url(case), {"from": "queue", "next": "https://evil.example/"})

    assert response["Location"] == reverse("review:queue")


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_a_held_case_cannot_be_claimed_by_someone_else(
    htmx: bool, ann: Client, bob: Client, case: Case, reviewer: Any
) -> None:
    services.case_claim(case_id=case.pk, user=reviewer)
    case.refresh_from_db()
    held_until = case.claim_expires_at
    events = CaseEvent.objects.count()

    response = bob.post(claim_url(case), **(HX if htmx else {}))

    assert response.status_code == 409
    html = response.content.decode()
    assert "reviewer-ann is working on this case" in html
    assert "Nothing was changed" in html
    case.refresh_from_db()
    assert case.claimed_by == reviewer and case.claim_expires_at == held_until
    assert CaseEvent.objects.count() == events


def test_conflict_from_a_queue_row_without_js_redirects_with_the_message(
    bob: Client, case: Case, reviewer: Any
) -> None:
    services.case_claim(case_id=case.pk, user=reviewer)

    response = bob.post(claim_url(case), {"from": "queue", "next": "/review/"}, follow=True)

    assert "reviewer-ann is working on this case" in response.content.decode()
    case.refresh_from_db()
    assert case.claimed_by == reviewer


def test_an_expired_claim_can_be_taken_over(
    bob: Client, case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    services.case_claim(case_id=case.pk, user=reviewer)

    with time_machine.travel(timezone.now() + services.CLAIM_DURATION + dt.timedelta(seconds=5)):
        response = bob.post(claim_url(case))

    assert response.status_code == 302
    case.refresh_from_db()
    assert case.claimed_by == second_reviewer
    taken = case.events.filter(reason="claimed").last()
    assert taken.data["expired_claim_of"] == "reviewer-ann"


def test_renewing_ones_own_claim_extends_it_without_a_new_event(
    case: Case, reviewer: Any
) -> None:
    first = services.case_claim(case_id=case.pk, user=reviewer)
    with time_machine.travel(timezone.now() + dt.timedelta(minutes=5)):
        renewed = services.case_claim(case_id=case.pk, user=reviewer)

    assert renewed.claim_expires_at > first.claim_expires_at
    assert claim_events(case) == ["claimed"]


def test_release_frees_the_case(ann: Client, case: Case, reviewer: Any) -> None:
    services.case_claim(case_id=case.pk, user=reviewer)

    response = ann.post(release_url(case), **HX)

    assert response.status_code == 200
    assert "anyone can claim it now" in response.content.decode()
    case.refresh_from_db()
    assert case.claimed_by is None and case.claim_expires_at is None
    assert claim_events(case) == ["claimed", "claim_released"]


def test_nobody_can_release_someone_elses_claim(
    bob: Client, case: Case, reviewer: Any
) -> None:
    services.case_claim(case_id=case.pk, user=reviewer)

    response = bob.post(release_url(case), **HX)

    assert response.status_code == 409
    case.refresh_from_db()
    assert case.claimed_by == reviewer
    assert claim_events(case) == ["claimed"]


def test_releasing_an_unclaimed_case_is_a_no_op(ann: Client, case: Case) -> None:
    response = ann.post(release_url(case))

    assert response.status_code == 302
    assert claim_events(case) == []


def test_a_resolved_case_cannot_be_claimed(ann: Client, case: Case) -> None:
    case_transitions.case_resolve(case=case, outcome="succeeded", actor="reconciler",
                                  reason="lookup_proved_success")
    events = CaseEvent.objects.count()

    response = ann.post(claim_url(case), **HX)

    assert response.status_code == 409
    assert "already resolved" in response.content.decode()
    case.refresh_from_db()
    assert case.claimed_by_id is None
    assert CaseEvent.objects.count() == events


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_two_reviewers_racing_for_a_claim_exactly_one_wins(
    agent: Any, reviewer: Any, second_reviewer: Any
) -> None:
    from tests.review.factories import review_case

    case = review_case(agent, 1)
    barrier = threading.Barrier(2)
    results: dict[str, str] = {}

    def race(user: Any) -> None:
        try:
            barrier.wait()
            services.case_claim(case_id=case.pk, user=user)
            results[user.username] = "won"
        except services.ClaimConflict:
            results[user.username] = "lost"
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(u,)) for u in (reviewer, second_reviewer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results.values()) == ["lost", "won"]
    case.refresh_from_db()
    winner = next(name for name, result in results.items() if result == "won")
    assert case.claimed_by.username == winner
    assert claim_events(case) == ["claimed"]
