"""Versions: new operations use the latest; old operations keep the version (schema, intent,
provider) they were recorded with; a used version can never change underneath them."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ledger import executor
from ledger.models import Operation, ToolVersion
from tests.catalogue.conftest import ACME_TOOLS, payout_params
from tests.catalogue.test_fault_matrix import reconcile_until_final

S = Operation.Status
OLD = "treasury-7:inv-2026-17:payout-1:v1"
NEW = "treasury-7:inv-2026-18:payout-1:v1"


def payout_block() -> str:
    text = Path(ACME_TOOLS).read_text()
    start = text.index("[[tools]]")
    return text[start:text.index("# A ticketing API")]


def with_payout_v2(tmp_path: Path) -> str:
    """acme.toml plus payout v2, whose intent gains a required `purpose`."""
    v2 = (payout_block()
          .replace("version = 1", "version = 2")
          .replace('intent_fields = ["supplier"', 'intent_fields = ["purpose", "supplier"')
          .replace('required = ["supplier"', 'required = ["purpose", "supplier"')
          .replace("[tools.params.properties.note]",
                   '[tools.params.properties.purpose]\ntype = "string"\nenum = ["goods", '
                   '"services"]\n\n[tools.params.properties.note]')
          .replace('body = { reference = "{operation_id}",',
                   'body = { reference = "{operation_id}", purpose = "{params.purpose}",')
          .replace('fields = { supplier = "/supplier"',
                   'fields = { purpose = "/purpose", supplier = "/supplier"'))
    path = tmp_path / "acme-v2.toml"
    path.write_text(Path(ACME_TOOLS).read_text() + "\n\n" + v2)
    return str(path)


def test_a_version_bump_while_an_old_operation_is_unknown(
    acme_agent, sandbox, frozen, settings, tmp_path
):
    old = executor.submit(agent=acme_agent, operation_id=OLD, tool_name="payout",
                          params=payout_params(note="sandbox:lose-response")).operation
    assert (old.status, old.tool_version) == (S.UNKNOWN, 1)

    settings.LEDGER_TOOLS_FILE = with_payout_v2(tmp_path)

    # The old one reconciles with its own version: its v1 request, same key, one effect.
    old = reconcile_until_final(old, frozen, sandbox)
    assert (old.status, old.tool_version) == (S.SUCCEEDED, 1)
    [effect] = sandbox.effects(OLD)
    assert "purpose" not in effect
    # New operations use v2's schema: without `purpose` they are refused, with it they run.
    with pytest.raises(executor.InvalidSubmission) as refused:
        executor.submit(agent=acme_agent, operation_id=NEW, tool_name="payout",
                        params=payout_params(invoice="inv-2026-18"))
    assert refused.value.errors == {"params.purpose": "is required"}
    new = executor.submit(agent=acme_agent, operation_id=NEW, tool_name="payout",
                          params=payout_params(invoice="inv-2026-18", purpose="goods")).operation
    assert (new.status, new.tool_version) == (S.SUCCEEDED, 2)
    assert new.intent_params["purpose"] == "goods"
    assert sandbox.effects(NEW)[0]["purpose"] == "goods"
    assert sandbox.effect_counts() == {OLD: 1, NEW: 1}
    # A replay of the old operation answers from its own record, whatever v2 says.
    replay = executor.submit(agent=acme_agent, operation_id=OLD, tool_name="payout",
                             params=payout_params(note="sandbox:lose-response"))
    assert replay.disposition is executor.Disposition.REPLAYED


def test_the_first_use_of_a_version_records_its_fingerprint_once(acme_agent, sandbox):
    for n in range(3):
        executor.submit(agent=acme_agent, operation_id=f"treasury-9:inv-{n}:payout-1:v1",
                        tool_name="payout", params=payout_params(invoice=f"inv-{n}"))

    assert list(ToolVersion.objects.values_list("tool", "version")) == [("payout", 1)]


def test_changing_a_used_version_is_refused_by_the_check_and_by_the_next_submission(
    acme_agent, sandbox, settings, tmp_path
):
    executor.submit(agent=acme_agent, operation_id=OLD, tool_name="payout",
                    params=payout_params())
    changed = tmp_path / "acme-changed.toml"
    changed.write_text(Path(ACME_TOOLS).read_text().replace("maximum = 100_000_000",
                                                            "maximum = 900_000_000"))
    settings.LEDGER_TOOLS_FILE = str(changed)

    with pytest.raises(SystemCheckError, match=r"ledger.E002.*tool 'payout' v1: .*already used"):
        call_command("check", databases=["default"])
    call_command("check")  # without a database the file alone is valid
    with pytest.raises(ImproperlyConfigured, match="declare the change as a new version"):
        executor.submit(agent=acme_agent, operation_id=NEW, tool_name="payout",
                        params=payout_params(invoice="inv-2026-18"))
    assert list(Operation.objects.values_list("operation_id", flat=True)) == [OLD]


def test_dropping_a_version_that_unresolved_operations_use_is_refused(
    acme_agent, sandbox, settings, tmp_path
):
    executor.submit(agent=acme_agent, operation_id=OLD, tool_name="payout",
                    params=payout_params(note="sandbox:lose-response"))
    renumbered = tmp_path / "acme-v3-only.toml"
    renumbered.write_text(Path(ACME_TOOLS).read_text().replace(
        'name = "payout"\nversion = 1', 'name = "payout"\nversion = 3'))
    settings.LEDGER_TOOLS_FILE = str(renumbered)

    with pytest.raises(SystemCheckError, match=r"tool 'payout' v1: .*unresolved operations"):
        call_command("check", databases=["default"])


def test_an_unchanged_catalogue_passes_the_database_check(acme_agent, sandbox):
    executor.submit(agent=acme_agent, operation_id=OLD, tool_name="payout",
                    params=payout_params())
    call_command("check", databases=["default"])
