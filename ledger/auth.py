"""Bearer tokens per agent: `al_<prefix>_<secret>`, stored as SHA-256, shown once."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any, cast

from django.conf import settings
from django.core.cache import cache
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions, throttling
from rest_framework.request import Request

from ledger.models import AgentCredential, Namespace

TOKEN_PREFIX_LENGTH = 8
# Writing last_used_at on every request would turn every replay into a write.
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


def hash_token(raw: str) -> str:
    # Tokens carry 256 bits of entropy, so a fast hash is enough (no dictionary to attack).
    return hashlib.sha256(raw.encode()).hexdigest()


def agent_create(
    *, name: str, tools: Iterable[str], namespace: str | None = None
) -> tuple[AgentCredential, str]:
    """Create a credential; the raw token is returned once and never stored.

    Without `namespace` the credential gets a namespace of its own; with one, it joins (or
    starts) that shared namespace, whose credentials share their operation IDs."""
    prefix, raw = _new_token()
    agent = AgentCredential(
        name=name, token_prefix=prefix, token_hash=hash_token(raw), allowed_tools=sorted(tools))
    if namespace:
        agent.namespace = Namespace.objects.get_or_create(name=namespace)[0]
    agent.save()  # without a namespace: one of its own (AgentCredential.save)
    return agent, raw


def _new_token() -> tuple[str, str]:
    prefix = secrets.token_hex(TOKEN_PREFIX_LENGTH // 2)
    return prefix, f"al_{prefix}_{secrets.token_urlsafe(32)}"


def agent_rotate(*, agent: AgentCredential) -> str:
    """Replace an agent's token; the old one stops working at once."""
    prefix, raw = _new_token()
    agent.token_prefix, agent.token_hash = prefix, hash_token(raw)
    agent.save(update_fields=["token_prefix", "token_hash"])
    return raw


def agent_revoke(*, agent: AgentCredential) -> None:
    agent.is_active = False
    agent.revoked_at = timezone.now()
    agent.save(update_fields=["is_active", "revoked_at"])
    credential_cache.clear()


class _CredentialCache:
    """Credentials this process verified in the last LEDGER_CREDENTIAL_CACHE_SECONDS, by token
    hash, so a request costs no credential query. A revocation, rotation or edit made in this
    process clears it at once (the signals below); one made in another process takes effect
    here within that many seconds. Only positive answers are kept: a bad token always asks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, AgentCredential]] = {}

    def get(self, digest: str) -> AgentCredential | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        expires, agent = entry
        if time.time() >= expires:
            with self._lock:
                self._entries.pop(digest, None)
            return None
        return agent

    def put(self, digest: str, agent: AgentCredential) -> None:
        ttl = float(getattr(settings, "LEDGER_CREDENTIAL_CACHE_SECONDS", 0) or 0)
        if ttl <= 0:
            return
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[digest] = (time.time() + ttl, agent)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


credential_cache = _CredentialCache()


@receiver(post_save, sender=AgentCredential)
@receiver(post_delete, sender=AgentCredential)
def _forget_credentials(sender: Any, **kwargs: Any) -> None:
    credential_cache.clear()


def agent_for_token(raw: str) -> AgentCredential | None:
    parts = raw.split("_")
    if len(parts) < 3 or parts[0] != "al" or len(parts[1]) != TOKEN_PREFIX_LENGTH:
        return None
    digest = hash_token(raw)
    cached = credential_cache.get(digest)
    if cached is not None:
        return cached
    agent = AgentCredential.objects.filter(token_prefix=parts[1], is_active=True).first()
    if agent is None or not hmac.compare_digest(agent.token_hash, digest):
        return None
    credential_cache.put(digest, agent)
    now = timezone.now()
    if agent.last_used_at is None or now - agent.last_used_at > LAST_USED_RESOLUTION:
        AgentCredential.objects.filter(pk=agent.pk).update(last_used_at=now)
        agent.last_used_at = now
    return agent


class FailedAuthenticationThrottle:
    """Failed authentications per client address, in the shared cache (Redis with CACHE_URL,
    so every web process counts together; the process-local cache otherwise). An address
    that failed LEDGER_AUTH_FAILURE_RATE times in the window gets 429 with Retry-After for
    every credential until the window has passed — before its token is even looked up."""

    cache_format = "ledger:authfail:%s"

    def __init__(self) -> None:
        number, period = str(settings.LEDGER_AUTH_FAILURE_RATE).split("/")
        self.num_requests = int(number)
        self.duration = {"s": 1, "m": 60, "h": 3600, "d": 86400}[period[0]]

    def _key(self, request: Request | HttpRequest) -> str:
        # get_ident reads only headers and META, which both request types have.
        return self.cache_format % throttling.BaseThrottle().get_ident(
            cast(Request, request))

    def wait(self, request: Request | HttpRequest) -> float | None:
        """Seconds until the address may try again, or None when it may try now."""
        now = time.time()
        history = [t for t in cache.get(self._key(request), []) if t > now - self.duration]
        if len(history) < self.num_requests:
            return None
        return max(history[0] + self.duration - now, 1.0)

    def record_failure(self, request: Request) -> None:
        now = time.time()
        key = self._key(request)
        history = [t for t in cache.get(key, []) if t > now - self.duration]
        history.append(now)
        cache.set(key, history[-self.num_requests:], self.duration)


BEARER = "Bearer"


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for any other shape."""
    scheme, _, raw = header.partition(" ")
    token = raw.strip()
    return token if scheme == BEARER and token else None


def agent_from_header(request: HttpRequest) -> AgentCredential | None:
    """The agent whose valid token the request carries, from an address that has not been
    refused for failed attempts; None in every other case — and then the caller lets
    AgentTokenAuthentication (below) answer, which says why and counts the failure."""
    token = bearer_token(request.META.get("HTTP_AUTHORIZATION", ""))
    if token is None or FailedAuthenticationThrottle().wait(request) is not None:
        return None
    return agent_for_token(token)


class AgentTokenAuthentication(authentication.BaseAuthentication):
    keyword = BEARER

    def authenticate(self, request: Request) -> tuple[AgentCredential, str] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        failures = FailedAuthenticationThrottle()
        wait = failures.wait(request)
        if wait is not None:
            raise exceptions.Throttled(wait=wait, detail=(
                "Too many failed authentications from this address; try again later."))
        token = bearer_token(header)
        if token is None:
            failures.record_failure(request)
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <agent token>'.")
        agent = agent_for_token(token)
        if agent is None:
            failures.record_failure(request)
            # Never echo the token back, not even in part.
            raise exceptions.AuthenticationFailed("Invalid or revoked agent token.")
        return agent, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="agent-ledger"'


class IsAgent(permissions.BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return isinstance(request.user, AgentCredential)


def request_agent(request: Request) -> AgentCredential:
    """The agent behind a request to a view guarded by IsAgent (the default permission class).

    DRF's stubs type request.user as the Django user model; here AgentTokenAuthentication puts
    an AgentCredential there and IsAgent has refused every other caller."""
    return cast(AgentCredential, request.user)


class AgentRateThrottle(throttling.SimpleRateThrottle):
    """N requests per period per agent, counted in a window that opens with the agent's first
    request and closes a period later: one atomic cache increment per request (one Redis INCR
    with CACHE_URL), where DRF's sliding log re-writes the whole request history on every call
    (its cost grows with the rate). A burst can reach up to 2 × N across two adjacent windows."""

    scope = "agent"

    def __init__(self) -> None:
        super().__init__()
        limit, period = self.parse_rate(self.rate)
        self.limit: int | None = limit
        self.period: int | None = period

    def allow_request(self, request: Request, view: object) -> bool:
        if self.limit is None or self.period is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        return self._count()

    def allow_agent(self, agent: AgentCredential) -> bool:
        """allow_request() for a request already known to come from `agent` (ledger.fast_path)."""
        if self.limit is None or self.period is None:
            return True
        self.key = self._key(agent.pk)
        return self._count()

    def _count(self) -> bool:
        assert self.key is not None and self.period is not None and self.limit is not None
        self.now = self.timer()
        if self.cache.add(self.key, 1, self.period):
            self.cache.set(f"{self.key}:opened", self.now, self.period)
            return True
        try:
            count = self.cache.incr(self.key)
        except ValueError:  # the window closed between add() and incr()
            self.cache.set(self.key, 1, self.period)
            self.cache.set(f"{self.key}:opened", self.now, self.period)
            return True
        return count <= self.limit

    def wait(self) -> float | None:
        if self.period is None:
            return None
        opened = self.cache.get(f"{self.key}:opened", self.now)
        return max(opened + self.period - self.now, 0.0)

    def get_cache_key(self, request: Request, view: object) -> str | None:
        if isinstance(request.user, AgentCredential):
            return self._key(request.user.pk)
        return self._key(self.get_ident(request))

    def _key(self, ident: object) -> str:
        return self.cache_format % {"scope": self.scope, "ident": ident}
