"""The distribution's name and licence."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_is_apache_licensed_under_its_own_name():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # "agent-ledger" on the package index is an unrelated project.
    assert project["name"] == "agent-ledger-server"
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]


def test_the_license_file_is_the_full_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
