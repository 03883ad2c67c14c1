"""README's "Guard your own tool" example is true: it is the catalogue the fault matrix runs,
and it loads and executes as it stands."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

from ledger import executor
from ledger.models import Operation
from tests.catalogue.conftest import ACME_TOOLS, payout_params


def readme_example() -> str:
    readme = (Path(settings.BASE_DIR) / "README.md").read_text()
    section = readme[readme.index("## Guard your own tool"):]
    return re.search(r"```toml\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_is_the_tested_catalogue_verbatim():
    assert readme_example() in Path(ACME_TOOLS).read_text()


def test_the_readme_example_loads_and_runs_against_the_sandbox(
    tmp_path, settings, monkeypatch, sandbox, sandbox_server, make_agent
):
    path = tmp_path / "tools.toml"
    path.write_text(readme_example())
    monkeypatch.setenv("ACME_PAYOUTS_URL", sandbox_server.url)
    monkeypatch.setenv("ACME_PAYOUTS_TOKEN", "Bearer readme")
    settings.LEDGER_TOOLS_FILE = str(path)
    agent, _ = make_agent("treasury-bot", tools=("payout",))

    operation = executor.submit(agent=agent, operation_id="t-1:inv-1:payout-1:v1",
                                tool_name="payout", params=payout_params()).operation

    assert operation.status == Operation.Status.SUCCEEDED
    assert sandbox.effect_counts() == {"t-1:inv-1:payout-1:v1": 1}
