"""System checks: the catalogue (always) and used tool versions (with --database)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Tags, register


@register("ledger")
def check_catalogue(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from ledger.tools import catalogue_problem

    problem = catalogue_problem()
    if problem is None:
        return []
    return [Error(f"{problem.path}: {line}", id="ledger.E001",
                  hint="Fix the catalogue (LEDGER_TOOLS_FILE); see README, "
                       "'Guard your own tool'.")
            for line in problem.problems]


@register(Tags.database)
def check_tool_versions(app_configs: Any = None, databases: Any = None,
                        **kwargs: Any) -> list[CheckMessage]:
    from ledger import tools, versions

    if not databases or tools.catalogue_problem() is not None:
        return []
    return [Error(message, id="ledger.E002")
            for alias in databases
            for message in versions.changed_versions(tools.catalogue(), using=alias)]
