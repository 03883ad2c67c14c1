"""The queue: what a row shows, the order, tabs, filters in the query string, keyset pages,
bounded counts and "N new — refresh"."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledger.models import AgentCredential
from reconciliation import transitions as case_transitions
from reconciliation.models import Case
from reconciliation.review import selectors, services
from tests.review.factories import checking_case, review_case

HX = {"HTTP_HX_REQUEST": "true"}
QUEUE = reverse("review:queue")


def row_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr id="case-row-(\d+)"', html)]


def test_a_row_shows_what_a_reviewer_needs(ann: Client, agent: AgentCredential) -> None:
    case = review_case(agent, 7, amount=1_234_56)

    html = ann.get(QUEUE).content.decode()

    row = html[html.index(f'id="case-row-{case.pk}"'):]
    row = row[: row.index("</tr>")]
    for expected in ("€1,234.56", "refund", "sandbox", "agent-1", "invoice-7",
                     "High value", "Unclaimed", "left", "Claim"):
        assert expected in row, expected


def test_only_cases_awaiting_review_are_listed(ann: Client, agent: AgentCredential) -> None:
    waiting = review_case(agent, 1)
    checking = checking_case(agent, 2)

    ids = row_ids(ann.get(QUEUE).content.decode())

    assert ids == [waiting.pk]
    assert checking.pk not in ids


def test_sorted_by_soonest_deadline_then_highest_value(
    ann: Client, agent: AgentCredential
) -> None:
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        small_now = review_case(agent, 1, amount=100)
        big_now = review_case(agent, 2, amount=900_000)
    with time_machine.travel(start - dt.timedelta(minutes=30), tick=False):
        earlier = review_case(agent, 3, amount=5)

    ids = row_ids(ann.get(QUEUE).content.decode())

    assert ids == [earlier.pk, big_now.pk, small_now.pk]


def test_tabs(ann: Client, bob: Client, agent: AgentCredential, reviewer: Any,
             second_reviewer: Any) -> None:
    mine = review_case(agent, 1)
    bobs = review_case(agent, 2)
    free = review_case(agent, 3)
    four_eyes = review_case(agent, 4, amount=2_000_000)
    services.case_claim(case_id=mine.pk, user=reviewer)
    services.case_claim(case_id=bobs.pk, user=second_reviewer)
    services.case_claim(case_id=four_eyes.pk, user=second_reviewer)
    services.case_decide(case_id=four_eyes.pk, user=second_reviewer, action="reject",
                       reason_code="other", note="no trace at the provider",
                       params_hash=four_eyes.operation.params_hash)
    with time_machine.travel(timezone.now() - dt.timedelta(hours=3, minutes=30)):
        breaching = review_case(agent, 5)

    def tab(name: str) -> set[int]:
        return set(row_ids(ann.get(QUEUE, {"tab": name}).content.decode()))

    assert tab("mine") == {mine.pk}
    assert tab("unclaimed") == {free.pk, four_eyes.pk, breaching.pk}
    assert tab("second") == {four_eyes.pk}
    assert tab("breaching") == {breaching.pk}
    assert tab("all") == {mine.pk, bobs.pk, free.pk, four_eyes.pk, breaching.pk}
    assert "1 of 2 approvals" in ann.get(QUEUE, {"tab": "second"}).content.decode()


def test_expired_claims_count_as_unclaimed(ann: Client, agent: AgentCredential,
                                           second_reviewer: Any) -> None:
    case = review_case(agent, 1)
    services.case_claim(case_id=case.pk, user=second_reviewer,
                      now=timezone.now() - services.CLAIM_DURATION - dt.timedelta(seconds=1))

    assert row_ids(ann.get(QUEUE, {"tab": "unclaimed"}).content.decode()) == [case.pk]


def test_filters_narrow_the_list_and_stay_in_the_links(
    ann: Client, agent: AgentCredential
) -> None:
    small = review_case(agent, 1, amount=500)
    big = review_case(agent, 2, amount=50_000)
    anomaly = review_case(agent, 3, amount=60_000, reason="anomaly")

    response = ann.get(QUEUE, {"tab": "all", "currency": "EUR", "min_value": "100",
                               "reason": "high_value"})

    html = response.content.decode()
    assert row_ids(html) == [big.pk]
    assert small.pk not in row_ids(html) and anomaly.pk not in row_ids(html)
    # The tab links carry the filters, so switching tabs keeps them.
    assert ('href="/review/?tab=mine&amp;reason=high_value&amp;currency=EUR&amp;min_value=100"'
            in html)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"tool": "refund"}, {1, 2}),
        ({"tool": "send_email"}, set()),
        ({"provider": "sandbox"}, {1, 2}),
        ({"currency": "EUR", "max_value": "10.00"}, {1}),
        ({"currency": "EUR", "min_value": "10.01"}, {2}),
        ({"currency": "JPY"}, set()),
        ({"age": "1h"}, {2}),
        ({"currency": "EUR", "min_value": "not a number"}, {1, 2}),  # ignored, not an error
        ({"min_value": "10.01"}, {1, 2}),  # an amount means nothing without its currency
    ],
)
def test_each_filter(ann: Client, agent: AgentCredential, params: dict[str, str],
                     expected: set[int]) -> None:
    cases = {}
    cases[1] = review_case(agent, 1, amount=1000)
    with time_machine.travel(timezone.now() - dt.timedelta(hours=2)):
        cases[2] = review_case(agent, 2, amount=5000)

    response = ann.get(QUEUE, params)

    assert response.status_code == 200
    assert set(row_ids(response.content.decode())) == {cases[n].pk for n in expected}


def test_htmx_tab_switch_answers_with_the_results_partial(
    ann: Client, case: Case
) -> None:
    response = ann.get(QUEUE, {"tab": "unclaimed"}, HTTP_HX_TARGET="queue-results", **HX)

    html = response.content.decode()
    assert html.lstrip().startswith('<div id="queue-results" tabindex="-1">')
    assert "<html" not in html and 'id="queue-filters"' not in html
    assert row_ids(html) == [case.pk]
    assert response["Vary"].count("HX-Request") == 1


def test_every_hx_get_link_has_an_href(ann: Client, agent: AgentCredential,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selectors, "PAGE_SIZE", 1)
    review_case(agent, 1)
    review_case(agent, 2)

    html = ann.get(QUEUE).content.decode()

    links = re.findall(r"<a\b[^>]*>", html)
    assert any("hx-get" in link for link in links)
    for link in links:
        assert "href=" in link, link


def test_keyset_pages_walk_forward_and_back(ann: Client, agent: AgentCredential,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selectors, "PAGE_SIZE", 2)
    start = timezone.now()
    cases = []
    for number in range(1, 6):
        with time_machine.travel(start + dt.timedelta(minutes=number), tick=False):
            cases.append(review_case(agent, number))
    expected = [c.pk for c in cases]

    first = ann.get(QUEUE).content.decode()
    second = ann.get(QUEUE, {"tab": "all", "after": expected[1]}).content.decode()
    third = ann.get(QUEUE, {"tab": "all", "after": expected[3]}).content.decode()
    back = ann.get(QUEUE, {"tab": "all", "before": expected[2]}).content.decode()

    assert row_ids(first) == expected[:2]
    assert f"after={expected[1]}" in first and 'rel="prev"' not in first
    assert row_ids(second) == expected[2:4]
    assert f"before={expected[2]}" in second and f"after={expected[3]}" in second
    assert row_ids(third) == expected[4:]
    assert 'rel="next"' not in third
    assert row_ids(back) == expected[:2]


def test_keyset_handles_equal_deadlines_and_missing_values(agent: AgentCredential,
                                                           reviewer: Any) -> None:
    frozen = timezone.now()
    with time_machine.travel(frozen, tick=False):
        cases = [review_case(agent, n, amount=amount)
                 for n, amount in enumerate([300, 300, 900, 100], start=1)]
    queryset = selectors.case_queue(user=reviewer, tab="all", filters=selectors.QueueFilters())
    everything = [c.pk for c in selectors.case_queue_page(queryset, size=10).cases]

    walked: list[int] = []
    after = None
    while True:
        page = selectors.case_queue_page(queryset, after=after, size=1)
        walked += [c.pk for c in page.cases]
        if page.next_after is None:
            break
        after = page.next_after

    assert walked == everything
    assert everything[0] == cases[2].pk and everything[-1] == cases[3].pk


def test_page_cost_does_not_grow_with_depth(
    ann: Client, agent: AgentCredential, monkeypatch: pytest.MonkeyPatch,
    django_assert_max_num_queries: Any,
) -> None:
    monkeypatch.setattr(selectors, "PAGE_SIZE", 2)
    cases = [review_case(agent, n) for n in range(1, 8)]
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as first:
        ann.get(QUEUE)
    with CaptureQueriesContext(connection) as deep:
        ann.get(QUEUE, {"tab": "all", "after": cases[2].pk})

    assert len(deep) <= len(first) + 1  # the cursor's anchor row
    assert not any("OFFSET" in q["sql"].upper() for q in deep.captured_queries)


def test_tab_counts_are_bounded(ann: Client, agent: AgentCredential,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selectors, "COUNT_BOUND", 2)
    for number in range(1, 4):
        review_case(agent, number)

    html = ann.get(QUEUE).content.decode()

    assert re.search(r'All open<span class="tab-count">2\+', html)


def test_new_arrivals_say_how_many_without_touching_the_list(
    ann: Client, agent: AgentCredential
) -> None:
    review_case(agent, 1)
    page = ann.get(QUEUE).content.decode()
    since = re.search(r"since=(\d+)", page).group(1)  # type: ignore[union-attr]
    url = reverse("review:new_arrivals")

    nothing = ann.get(url, {"since": since, "shown": 0, "list": "/review/?tab=all"}, **HX)
    review_case(agent, 2)
    review_case(agent, 3)
    checking_case(agent, 4)  # not in review: not counted
    two = ann.get(url, {"since": since, "shown": 0, "list": "/review/?tab=all"}, **HX)
    same = ann.get(url, {"since": since, "shown": 2, "list": "/review/?tab=all"}, **HX)

    assert nothing.status_code == 204
    assert two.status_code == 200
    assert "2 new — refresh" in two.content.decode()
    assert 'href="/review/?tab=all"' in two.content.decode()
    assert same.status_code == 204


def test_new_arrivals_without_htmx_redirect_to_the_list(ann: Client) -> None:
    response = ann.get(reverse("review:new_arrivals"), {"list": "https://evil.example/"})

    assert response.status_code == 302
    assert response["Location"] == QUEUE


def test_resolved_cases_leave_the_queue(ann: Client, case: Case) -> None:
    case_transitions.case_resolve(case=case, outcome="failed", actor="test", reason="test")

    assert row_ids(ann.get(QUEUE).content.decode()) == []


@pytest.mark.parametrize(("currency", "typed", "amount", "matches"), [
    ("JPY", "2,500", 2500, True),  # zero decimals: 2,500 yen is 2,500 minor units
    ("JPY", "2,501", 2500, False),
    ("KWD", "2.5", 2500, True),  # three decimals: 2.500 dinars
    ("KWD", "2.501", 2500, False),
    ("EUR", "25", 2500, True),
])
def test_value_filters_read_amounts_with_the_currency_exponent(
    ann: Client, agent: AgentCredential, currency: str, typed: str, amount: int,
    matches: bool,
) -> None:
    case = review_case(agent, 1, amount=amount, currency=currency)
    review_case(agent, 2, amount=amount, currency="USD" if currency != "USD" else "EUR")

    response = ann.get(QUEUE, {"currency": currency, "min_value": typed})

    assert row_ids(response.content.decode()) == ([case.pk] if matches else [])


def test_value_filter_with_too_many_decimals_says_why(ann: Client, case: Case) -> None:
    response = ann.get(QUEUE, {"currency": "JPY", "min_value": "2.5"})

    assert "JPY amounts have no decimals." in response.content.decode()


def test_queue_rows_show_amounts_in_their_currency(ann: Client, agent: AgentCredential) -> None:
    review_case(agent, 1, amount=2500, currency="JPY")
    review_case(agent, 2, amount=2500, currency="KWD")
    review_case(agent, 3, amount=2500, currency="EUR")

    html = ann.get(QUEUE).content.decode()

    assert "¥2,500" in html and "2.500\xa0KWD" in html and "€25.00" in html
    assert "25.00 JPY" not in html and "25.00 KWD" not in html
