"""Used tool versions are immutable: their fingerprints, recorded on first use, are checked.

The check runs where a database is at hand — `manage.py check --database default` (also run
by `migrate`, so `bin/run` refuses a changed version before starting) — and at the first use
of each version in each process, so a changed version is refused before anything is recorded
under it. After that first use, the process remembers the answer: no query per request.
"""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from ledger.catalogue import Catalogue, Tool

_recorded: set[tuple[str, int, str]] = set()
_lock = threading.Lock()


class ToolVersionChanged(ImproperlyConfigured):
    pass


def changed_message(tool: str, version: int) -> str:
    return (f"tool {tool!r} v{version}: key 'params'/'intent_fields': this version was already "
            "used by operations and its schema, intent fields, value, subject or provider "
            "changed; declare the change as a new version instead")


def forget_recorded() -> None:
    with _lock:
        _recorded.clear()


def ensure_recorded(tool: Tool) -> None:
    from ledger.models import ToolVersion

    key = (tool.name, tool.version, tool.fingerprint)
    if key in _recorded:
        return
    row, _ = ToolVersion.objects.get_or_create(
        tool=tool.name, version=tool.version, defaults={"fingerprint": tool.fingerprint})
    if row.fingerprint != tool.fingerprint:
        raise ToolVersionChanged(changed_message(tool.name, tool.version))
    with _lock:
        _recorded.add(key)


def changed_versions(catalogue: Catalogue, *, using: str = "default") -> list[str]:
    """Every declared version whose recorded fingerprint differs (an empty list when the
    table does not exist yet: before the first migrate nothing was used)."""
    from ledger.models import ToolVersion

    try:
        recorded = list(ToolVersion.objects.using(using).values_list(
            "tool", "version", "fingerprint"))
    except DatabaseError:
        return []
    problems = []
    for name, version, fingerprint in recorded:
        tool = catalogue.versions.get(name, {}).get(version)
        if tool is not None and tool.fingerprint != fingerprint:
            problems.append(changed_message(name, version))
    problems.extend(
        f"tool {name!r} v{version}: key 'version': unresolved operations were recorded with "
        "this version; keep declaring it until they are resolved"
        for name, version in _unresolved_versions(using)
        if version not in catalogue.versions.get(name, {}))
    return problems


def _unresolved_versions(using: str) -> list[tuple[str, int]]:
    from ledger.models import Operation

    return sorted(set(Operation.objects.using(using).exclude(
        status__in=Operation.TERMINAL).values_list("tool", "tool_version").distinct()))
