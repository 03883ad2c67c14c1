"""Browser tests: Debian's Chromium driven by pytest-playwright against pytest-django's
live_server. Nothing is downloaded: the browser is /usr/bin/chromium."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from playwright.sync_api import BrowserContext, ConsoleMessage, Page

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path("/tmp/shots")


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
        ],
    }


@pytest.fixture(scope="session", autouse=True)
def _sync_playwright_beside_the_orm() -> Iterator[None]:
    # Playwright's sync API keeps an asyncio loop registered on the main thread from its first
    # use until the session ends, so Django's async-safety check would refuse every ORM call
    # made afterwards (the test database setup included), although they are all plain
    # synchronous calls. Session-scoped and autouse, so it is in place before either starts.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@dataclass
class ConsoleLog:
    """Everything the page said on the console, and every CSP violation it reported."""

    messages: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def watch(self, page: Page) -> Page:
        page.on("console", self._console)
        # securitypolicyviolation fires in the page for every blocked script, style or
        # connection; report it through the console so the test sees it.
        page.add_init_script(
            "document.addEventListener('securitypolicyviolation', e => console.error("
            "'CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI));"
        )
        return page

    def _console(self, message: ConsoleMessage) -> None:
        text = f"{message.type}: {message.text}"
        self.messages.append(text)
        if "Content Security Policy" in message.text or "CSP violation" in message.text:
            self.violations.append(text)


@pytest.fixture
def console() -> ConsoleLog:
    return ConsoleLog()


def session_cookie(user: Any, live_url: str) -> dict[str, Any]:
    """A logged-in session for `user`, as a cookie for the browser (no login form to drive)."""
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return {"name": settings.SESSION_COOKIE_NAME, "value": store.session_key, "url": live_url}


@pytest.fixture
def staff_page(
    context: BrowserContext, live_server: Any, console: ConsoleLog
) -> Iterator[Callable[[Any], Page]]:
    """A new browser context (own cookies) per staff member, each logged in."""
    contexts: list[BrowserContext] = []

    def open_as(user: Any) -> Page:
        own = context.browser.new_context()  # type: ignore[union-attr]
        contexts.append(own)
        own.add_cookies([session_cookie(user, live_server.url)])
        return console.watch(own.new_page())

    yield open_as
    for own in contexts:
        own.close()


def shot(page: Page, name: str, *, full_page: bool = True) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
