"""System checks for production settings (`manage.py check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

MIN_SECRET_KEY_LENGTH = 50
MIN_SECRET_KEY_UNIQUE_CHARACTERS = 5


def secret_key_errors() -> list[checks.CheckMessage]:
    """With LEDGER_PRODUCTION on, an empty, short, simple or development secret key is an
    error (Django's own security.W009 is only a warning): it signs sessions, CSRF tokens and
    the review queue's logins."""
    if not settings.PRODUCTION:
        return []
    key = str(settings.SECRET_KEY or "")
    problem = None
    if not key or settings.SECRET_KEY_GIVEN == "":
        problem = "DJANGO_SECRET_KEY is empty"
    elif key == settings.DEVELOPMENT_SECRET_KEY or key.startswith("django-insecure"):
        problem = "DJANGO_SECRET_KEY is the development key"
    elif len(key) < MIN_SECRET_KEY_LENGTH or len(set(key)) < MIN_SECRET_KEY_UNIQUE_CHARACTERS:
        problem = (f"DJANGO_SECRET_KEY is shorter than {MIN_SECRET_KEY_LENGTH} characters or has "
                   f"fewer than {MIN_SECRET_KEY_UNIQUE_CHARACTERS} different ones")
    if problem is None:
        return []
    return [checks.Error(
        f"{problem} while LEDGER_PRODUCTION is on.",
        hint="Set DJANGO_SECRET_KEY to a long random value, e.g. "
             "`python -c 'import secrets; print(secrets.token_urlsafe(64))'`.",
        id="ledger.E001",
    )]


# Not deploy-only: with LEDGER_PRODUCTION on, every management command refuses a bad key.
@checks.register(checks.Tags.security)
def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return secret_key_errors()
