"""`manage.py check --deploy` with LEDGER_PRODUCTION=true: a bad secret key is an Error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GOOD_KEY = "k3Y-" + "production-secret-for-the-check-" + "abcdefghijklmnopqrstuvwxyz"


def check_deploy(tmp_path, secret: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DJANGO_ALLOW_ASYNC_UNSAFE", "DJANGO_SECRET_KEY"}}
    env |= {"LEDGER_PRODUCTION": "true", "DJANGO_ALLOWED_HOSTS": "ledger.example.com",
            "LEDGER_VAR_DIR": str(tmp_path)}
    if secret is not None:
        env["DJANGO_SECRET_KEY"] = secret
    # --fail-level ERROR: only errors fail, so a warning would pass (what Django's W009 is).
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "ERROR"],
        capture_output=True, text=True, env=env, timeout=60,
    )


@pytest.mark.parametrize(
    ("secret", "says"),
    [("", "is empty"), ("short-key", "shorter than 50"), ("a" * 60, "shorter than 50"),
     (None, "development key")],
)
def test_an_empty_short_or_development_secret_key_is_an_error(tmp_path, secret, says):
    result = check_deploy(tmp_path, secret)
    assert result.returncode != 0
    assert "ERRORS" in result.stderr and "ledger.E001" in result.stderr
    assert says in result.stderr


def test_a_long_random_secret_key_passes(tmp_path):
    result = check_deploy(tmp_path, GOOD_KEY)
    assert result.returncode == 0, result.stderr


def test_the_wsgi_application_refuses_to_start_with_a_short_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    env |= {"LEDGER_PRODUCTION": "true", "DJANGO_SECRET_KEY": "short",
            "LEDGER_VAR_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", "import config.wsgi"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr


def test_database_test_name_names_the_suites_postgresql_database(tmp_path):
    """README: `DATABASE_TEST_NAME` runs the suite on a named PostgreSQL database."""
    script = ("import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
              "'config.settings'); django.setup(); from django.conf import settings; "
              "print(settings.DATABASES['default']['TEST']['NAME'])")
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_TEST_NAME"} | {
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/agent_ledger",
        "LEDGER_VAR_DIR": str(tmp_path)}
    named = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                           text=True, timeout=60, check=True,
                           env=base | {"DATABASE_TEST_NAME": "ledger_suite_named"})
    default = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True, env=base)
    assert named.stdout.strip() == "ledger_suite_named"
    assert default.stdout.strip().startswith("test_agent_ledger_")
