"""A credential the catalogue names (env:NAME) is sent to the provider and nowhere else: not
in a page, a log line, an event or evidence row, an API answer, or a check message."""

from __future__ import annotations

import json
import logging

from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from ledger import executor
from ledger.auth import agent_create
from ledger.models import Operation, OperationEvent
from ledger.tools import get_tool
from reconciliation.models import Case, CaseEvent, Evidence
from reconciliation.services import case_check_now
from tests.catalogue.conftest import ACME_TOKEN, payout_params
from tests.reconciliation.helpers import sweep

SECRET = ACME_TOKEN.removeprefix("Bearer ")


def every_row_as_text() -> str:
    rows = [*OperationEvent.objects.values(), *Evidence.objects.values(),
            *CaseEvent.objects.values(), *Operation.objects.values(), *Case.objects.values()]
    return json.dumps(rows, default=str)


def test_the_credential_header_is_sent_but_never_shown_logged_or_stored(
    acme, sandbox, caplog, admin_client, capsys
):
    caplog.set_level(logging.DEBUG)
    agent, token = agent_create(name="treasury-bot", tools=["payout"])
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    # Sent: the sandbox answers 401 to a request without a bearer token.
    done = api.post("/api/v1/operations", {
        "operation_id": "t-1:inv-1:payout-1:v1", "tool": "payout",
        "params": payout_params(invoice="inv-1")}, format="json")
    assert done.status_code == 201 and done.json()["status"] == "succeeded"
    unknown = executor.submit(agent=agent, operation_id="t-1:inv-2:payout-1:v1",
                              tool_name="payout",
                              params=payout_params(invoice="inv-2",
                                                   note="sandbox:500-after-commit")).operation
    rejected = executor.submit(agent=agent, operation_id="t-1:inv-3:payout-1:v1",
                               tool_name="payout",
                               params=payout_params(invoice="inv-3",
                                                    note="sandbox:reject")).operation
    assert rejected.status == Operation.Status.FAILED
    case = Case.objects.get(operation=unknown)
    case_check_now(case=case, actor="staff:admin")
    sweep()

    responses = [
        api.get("/api/v1/tools"),
        api.get("/api/v1/tools/payout"),
        api.get(f"/api/v1/operations/{unknown.operation_id}"),
        admin_client.get(reverse("review:case", args=[case.pk])),
        admin_client.get(reverse("review:queue")),
        admin_client.get(f"/admin/ledger/operation/{unknown.pk}/change/"),
        admin_client.get("/admin/ledger/operation/"),
        admin_client.get(f"/admin/reconciliation/case/{case.pk}/change/"),
        admin_client.get(reverse("portal:status", args=[unknown.status_token])),
    ]
    assert [r.status_code for r in responses] == [200] * len(responses)
    pages = [r.content for r in responses]
    call_command("check")
    assert all(b"payout" in page or b"inv-2" in page for page in pages[:3])
    for page in pages:
        assert SECRET.encode() not in page
    assert SECRET not in caplog.text
    assert SECRET not in capsys.readouterr().out
    assert SECRET not in every_row_as_text()
    tool = get_tool("payout")
    assert SECRET not in repr(tool) and SECRET not in repr(tool.adapter)
    assert SECRET not in repr(tool.adapter.settings)
    assert sandbox.effect_counts() == {"t-1:inv-1:payout-1:v1": 1, "t-1:inv-2:payout-1:v1": 1}


def with_secret_param(tmp_path) -> str:
    """acme.toml's payout with a one-time code the provider needs and the ledger never keeps."""
    from pathlib import Path

    from tests.catalogue.conftest import ACME_TOOLS

    text = Path(ACME_TOOLS).read_text().replace(
        'free_text_fields = ["note"]\n', 'free_text_fields = ["note"]\nsecret_fields = ["otp"]\n',
        1).replace(
        "[tools.params.properties.note]",
        '[tools.params.properties.otp]\ntype = "string"\n\n[tools.params.properties.note]', 1
    ).replace('note = "{params.note}" }', 'note = "{params.note}", otp = "{params.otp}" }', 1)
    path = tmp_path / "acme-otp.toml"
    path.write_text(text)
    return str(path)


def test_a_secret_param_is_sent_once_by_its_caller_and_never_stored_or_resent(
    acme, acme_agent, sandbox, settings, tmp_path, frozen
):
    from tests.catalogue.test_fault_matrix import reconcile_until_final

    settings.LEDGER_TOOLS_FILE = with_secret_param(tmp_path)
    operation = executor.submit(agent=acme_agent, operation_id="t-2:inv-1:payout-1:v1",
                                tool_name="payout",
                                params=payout_params(otp="493-117",
                                                     note="sandbox:lose-response")).operation
    assert operation.status == Operation.Status.UNKNOWN
    assert operation.params["otp"] == "[redacted]" and "493-117" not in every_row_as_text()
    assert sandbox.effects("t-2:inv-1:payout-1:v1")[0]["otp"] == "493-117"  # it was sent

    operation = reconcile_until_final(operation, frozen, sandbox)

    case = Case.objects.get(operation=operation)
    assert operation.status == Operation.Status.SUCCEEDED
    assert [e.kind for e in Evidence.objects.filter(case=case)] == ["lookup"]  # not re-sent
    assert sandbox.effect_counts() == {"t-2:inv-1:payout-1:v1": 1}


def test_secret_params_are_never_queued_for_a_worker(acme, acme_agent, sandbox, settings,
                                                     tmp_path):
    import pytest

    settings.LEDGER_TOOLS_FILE = with_secret_param(tmp_path)

    with pytest.raises(executor.InvalidSubmission) as refused:
        executor.submit(agent=acme_agent, operation_id="t-2:inv-2:payout-1:v1",
                        tool_name="payout", params=payout_params(otp="1"), execute=False)
    assert "execution" in refused.value.errors
    assert not Operation.objects.exists()
