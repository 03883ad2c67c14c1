"""A catalogue with no Python behind it (tests/catalogues/acme.toml) against the sandbox's
generic JSON endpoint, and an agent allowed to use its tools."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import CATALOGUES

ACME_TOOLS = str(CATALOGUES / "acme.toml")
# The credential the catalogue reads from the environment: it must never show anywhere.
ACME_TOKEN = "Bearer acme_live_token_must_never_show_1f6e"


@pytest.fixture
def acme(settings: Any, monkeypatch: pytest.MonkeyPatch, sandbox: Any, sandbox_server: Any
         ) -> str:
    monkeypatch.setenv("ACME_PAYOUTS_URL", sandbox_server.url)
    monkeypatch.setenv("ACME_PAYOUTS_TOKEN", ACME_TOKEN)
    settings.LEDGER_TOOLS_FILE = ACME_TOOLS
    return ACME_TOOLS


@pytest.fixture
def acme_agent(acme: str, make_agent: Any) -> Any:
    agent, _ = make_agent("treasury-bot", tools=("payout", "create_issue"))
    return agent


def payout_params(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"supplier": "sup_42", "invoice": "inv-2026-17",
                              "amount_minor": 125_000, "currency": "EUR",
                              "note": "March invoice"}
    params.update(overrides)
    return params


def issue_params(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"project": "billing", "supplier": "sup_42",
                              "title": "Payout did not arrive", "body": "Please check"}
    params.update(overrides)
    return params
