"""Request types for the type checker: what the middleware and a view's access check guarantee
beyond django.http.HttpRequest. Nothing here changes a request at runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpRequest

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """A request that went through django_htmx's HtmxMiddleware (in MIDDLEWARE for every
    request), which sets request.htmx."""

    htmx: HtmxDetails


def authenticated_user(request: HttpRequest) -> User:
    """request.user in a view that only a signed-in user reaches (the admin site's actions,
    review_required): the check has been made before the view runs."""
    user = request.user
    assert user.is_authenticated, "the view's access check admits signed-in users only"
    return user
