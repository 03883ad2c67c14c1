"""A bad catalogue is refused when it is loaded — at start-up and by `manage.py check` — with
the tool, the key and what is wrong; never at send time."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ledger import executor
from ledger.catalogue import CatalogueError, catalogue_from
from ledger.models import Operation

BASE: dict[str, Any] = {
    "name": "payout", "version": 1, "description": "Pay a supplier.",
    "intent_fields": ["supplier", "amount", "currency"], "free_text_fields": ["note"],
    "subject": "supplier", "value": {"amount": "amount", "currency": "currency"},
    "high_value": {"EUR": 100_000}, "four_eyes": {"EUR": 1_000_000},
    "params": {
        "type": "object", "required": ["supplier", "amount", "currency"],
        "additionalProperties": False,
        "properties": {"supplier": {"type": "string"}, "amount": {"type": "integer"},
                       "currency": {"type": "string"}, "note": {"type": "string"}},
    },
    "provider": {
        "connector": "http", "name": "acme", "base_url": "https://api.acme.example",
        "headers": {"Authorization": "env:CATALOGUE_TEST_TOKEN"},
        "send": {"url": "/v1/payouts"},
        "lookup": {"by_key": "/v1/payouts?key={key}",
                   "fields": {"supplier": "/supplier", "amount": "/amount",
                              "currency": "/currency", "reference": "/reference"}},
    },
}


def entry(**changes: Any) -> dict[str, Any]:
    """BASE with dotted keys set (value None deletes the key)."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for part in path:
            node = node[part]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


@pytest.fixture(autouse=True)
def _token(monkeypatch):
    monkeypatch.setenv("CATALOGUE_TEST_TOKEN", "Bearer t0k3n")


def test_the_base_entry_is_valid():
    catalogue = catalogue_from({"tools": [entry()]})
    assert catalogue.latest["payout"].provider == "acme"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"provider__connector": "carrier-pigeon"},
         "key 'provider.connector': unknown connector 'carrier-pigeon'"),
        ({"colour": "blue"}, "key 'colour': unknown key"),
        ({"provider__retries": 3}, "key 'provider.retries': unknown key"),
        ({"provider__send__verb": "POST"}, "key 'provider.send.verb': unknown key"),
        ({"high_value": {"EUR": 1, "XYZ": 5}},
         "key 'high_value.XYZ': is not an ISO 4217 currency code"),
        ({"four_eyes": {"EUR": 10.5}}, "key 'four_eyes.EUR': must be an integer amount"),
        ({"provider__headers": {"Authorization": "env:CATALOGUE_TEST_MISSING"}},
         "key 'provider.headers.Authorization': environment variable CATALOGUE_TEST_MISSING "
         "is not set"),
        ({"provider__headers": {"Authorization": "Bearer pasted-secret"}},
         "key 'provider.headers.Authorization': a credential header must be a reference"),
        ({"intent_fields": ["supplier", "amount", "iban"]},
         "key 'intent_fields': 'iban' is not a property of params"),
        ({"secret_fields": ["pin"]}, "key 'secret_fields': 'pin' is not a property of params"),
        ({"free_text_fields": ["amount"]}, "key 'free_text_fields': 'amount' is also an intent"),
        ({"params__properties__amount": {"type": "money"}},
         "key 'params.properties.amount.type': is not a valid JSON Schema"),
        ({"params__additionalProperties": None},
         "key 'params.additionalProperties': must be false"),
        ({"value": {"amount": "note", "currency": "currency"}},
         "key 'value.amount': 'note' must be of type integer"),
        ({"subject": "nobody"}, "key 'subject': must name a property of params"),
        ({"version": 0}, "key 'version': must be a positive integer"),
        ({"provider__send__url": "/v1/payouts/{params.iban}"},
         "key 'provider.send.url': {params.iban} names no property of the schema"),
        ({"provider__send__url": "/v1/{secret}"},
         "key 'provider.send.url': unknown placeholder {secret}"),
        ({"provider__lookup__fields": {"supplier": "/supplier", "reference": "/reference"}},
         "key 'provider.lookup.fields': must say where the provider holds amount, currency"),
        ({"provider__lookup__items": "data"},
         "key 'provider.lookup.items': must be a JSON Pointer"),
        ({"provider__send__rejection_statuses": [400, 409]},
         "key 'provider.send.rejection_statuses': [409] also listed as in progress"),
        ({"provider__send": None, "client_execution": False},
         "key 'provider.send': a lookup-only connector needs client_execution = true"),
        ({"provider__base_url": "setting:NO_SUCH_SETTING"},
         "key 'provider.base_url': names no Django setting 'NO_SUCH_SETTING'"),
        ({"provider": {"connector": "stripe", "api_key": "sk_live_pasted"}},
         "key 'provider.api_key': a secret must be a reference to an environment variable"),
        ({"provider": {"connector": "smtp", "host": "smtp.example", "sender": "a@b.example",
                       "tls": "sometimes"}},
         "key 'provider.tls': must be one of none, starttls, implicit"),
    ],
)
def test_each_malformed_entry_names_the_tool_the_key_and_the_problem(changes, message):
    with pytest.raises(CatalogueError) as refused:
        catalogue_from({"tools": [entry(**changes)]}, path="tools.toml")

    assert f"tool 'payout' v{changes.get('version', 1)}: {message}" in str(refused.value)


def test_a_version_declared_twice_is_refused():
    with pytest.raises(CatalogueError, match="tool 'payout' v1: key 'version': declared twice"):
        catalogue_from({"tools": [entry(), entry()]})


def test_every_problem_is_reported_not_just_the_first():
    with pytest.raises(CatalogueError) as refused:
        catalogue_from({"tools": [entry(colour="blue"), entry(name="other", version=0)]})
    assert len(refused.value.problems) == 2


def test_manage_py_check_refuses_a_broken_catalogue_file_and_submissions_are_refused(
    tmp_path, settings, agent
):
    broken = tmp_path / "tools.toml"
    broken.write_text('[[tools]]\nname = "refund"\nversion = 1\ncolour = "blue"\n')
    settings.LEDGER_TOOLS_FILE = str(broken)

    with pytest.raises(SystemCheckError, match=r"ledger.E001.*tool 'refund' v1: key 'colour': "
                                               r"unknown key"):
        call_command("check")
    with pytest.raises(ImproperlyConfigured, match="unknown key"):
        executor.submit(agent=agent, operation_id="wf-1:inv-1:refund-1:v1", tool_name="refund",
                        params={})
    assert not Operation.objects.exists()


def test_a_file_that_is_not_toml_is_refused_with_its_line(tmp_path, settings, db):
    broken = tmp_path / "tools.toml"
    broken.write_text("[[tools]\nname = \n")
    settings.LEDGER_TOOLS_FILE = str(broken)

    with pytest.raises(SystemCheckError, match="is not valid TOML .*line 1"):
        call_command("check")


def test_the_shipped_catalogues_pass_the_check(settings, db):
    from tests.conftest import DEMO_TOOLS, STRIPE_SMTP_TOOLS

    for path in (DEMO_TOOLS, STRIPE_SMTP_TOOLS):
        settings.LEDGER_TOOLS_FILE = path
        call_command("check")
