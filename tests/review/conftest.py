from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger.models import AgentCredential
from reconciliation.models import Case
from tests.review.factories import review_case


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def ann(reviewer: Any) -> Client:
    return logged_in(reviewer)


@pytest.fixture
def bob(second_reviewer: Any) -> Client:
    return logged_in(second_reviewer)


@pytest.fixture
def case(agent: AgentCredential) -> Case:
    return review_case(agent, 1, amount=2500)


@pytest.fixture
def big_case(agent: AgentCredential) -> Case:
    return review_case(agent, 2, amount=1_500_000)
