"""The review code keeps one subject per module and its layers point one way."""

from __future__ import annotations

import ast
from pathlib import Path

import reconciliation

PACKAGE = Path(reconciliation.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_case_transitions_never_import_the_services_that_call_them() -> None:
    imports = imported_modules(PACKAGE / "transitions.py")
    assert "reconciliation.services" not in imports
    assert not any(name.startswith("reconciliation.review") for name in imports)


def test_review_is_split_into_selectors_services_and_presentation() -> None:
    assert not (PACKAGE / "review.py").exists()
    for module in ("selectors", "services", "presentation"):
        assert (PACKAGE / "review" / f"{module}.py").exists()


def test_review_writes_and_reads_do_not_depend_on_presentation() -> None:
    for module in ("selectors", "services"):
        imports = imported_modules(PACKAGE / "review" / f"{module}.py")
        assert "reconciliation.review.presentation" not in imports
    assert "reconciliation.review.services" not in imported_modules(
        PACKAGE / "review" / "selectors.py")
