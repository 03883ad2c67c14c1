"""The tool registry: the catalogue (LEDGER_TOOLS_FILE) as loaded at start-up, in memory.

`get_tool(name)` is the version new operations use (the highest declared); `get_tool(name,
version=N)` is the version an operation was recorded with, which replays, reconciliation and
review keep using. A broken catalogue is remembered (so `manage.py check` can name every
problem) and refused by every read.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ledger.catalogue import Catalogue, CatalogueError, Tool, load_catalogue
from ledger.providers.base import ProviderAdapter

if TYPE_CHECKING:
    from ledger.models import Operation

__all__ = ["Tool", "UnknownTool", "get_tool", "tool_names", "latest_tools", "tool_of",
           "adapter_of", "catalogue", "load", "catalogue_problem"]


class UnknownTool(LookupError):
    pass


_lock = threading.Lock()
_state: Catalogue | CatalogueError | None = None


def load(path: str | None = None) -> Catalogue | CatalogueError:
    """(Re)load the catalogue; a failure is kept, not raised, for `manage.py check`."""
    global _state
    from django.conf import settings

    source = str(path or settings.LEDGER_TOOLS_FILE)
    try:
        state: Catalogue | CatalogueError = load_catalogue(source)
    except CatalogueError as exc:
        state = exc
    with _lock:
        _state = state
    from ledger import versions

    versions.forget_recorded()
    return state


def catalogue() -> Catalogue:
    state = _state if _state is not None else load()
    if isinstance(state, CatalogueError):
        raise ImproperlyConfigured(str(state))
    return state


def catalogue_problem() -> CatalogueError | None:
    state = _state if _state is not None else load()
    return state if isinstance(state, CatalogueError) else None


def get_tool(name: str, version: int | None = None) -> Tool:
    versions = catalogue().versions.get(name)
    if not versions:
        raise UnknownTool(name)
    if version is None:
        return versions[max(versions)]
    try:
        return versions[version]
    except KeyError:
        raise UnknownTool(f"{name} v{version}") from None


def tool_names() -> list[str]:
    return sorted(catalogue().versions)


def latest_tools() -> list[Tool]:
    return [get_tool(name) for name in tool_names()]


def tool_of(operation: Operation) -> Tool:
    """The version the operation was recorded with."""
    return get_tool(operation.tool, version=operation.tool_version)


def adapter_of(operation: Operation) -> ProviderAdapter:
    return tool_of(operation).adapter


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "LEDGER_TOOLS_FILE":
        load()
