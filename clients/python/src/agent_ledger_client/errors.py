"""Every problem type the ledger answers, as an exception carrying its problem+json fields.

A 202 is never an exception: "still in progress" and "unknown" are answers (an Operation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class LedgerError(Exception):
    """Base class of everything this package raises."""


class UnsafeOperationId(LedgerError, ValueError):
    """An operation ID part looks like a model's tool-call ID or a per-attempt random UUID.

    Those change when the model regenerates the call or the process retries, so the same
    intent would get a new identity — exactly the duplicate the ledger exists to prevent.
    """


class ProblemError(LedgerError):
    """An RFC 9457 problem answered by the ledger (`application/problem+json`)."""

    def __init__(self, status: int, body: Mapping[str, Any] | None = None, *,
                 operation_id: str | None = None) -> None:
        body = dict(body or {})
        self.status = status
        self.body = body
        self.type: str = str(body.get("type", ""))
        self.title: str = str(body.get("title", ""))
        self.detail: Any = body.get("detail", "")
        self.code: str = str(body.get("code") or self.type.rsplit("/", 1)[-1] or "error")
        self.operation_id = operation_id
        super().__init__(f"{status} {self.code}: {self.title or self.detail}")


class InvalidRequest(ProblemError):
    """400 (or 413): the body, the operation ID or the params were refused; nothing was written."""

    @property
    def errors(self) -> Any:
        return self.body.get("errors", {})


class Unauthenticated(ProblemError):
    """401: no or bad credential. Raised at once, never retried."""


class ToolNotAllowed(ProblemError):
    """403: this agent may not use the tool. Raised at once, never retried."""


class NotFound(ProblemError):
    """404: no such operation (or tool) for this agent."""


class StaleFencingToken(ProblemError):
    """409 `stale_fencing_token`: a newer attempt holds the claim; the report was kept as
    evidence and not applied."""


class ParamsConflict(ProblemError):
    """422: the operation ID already names a different intent. Final: never retried.

    `differences` maps each differing intent field to `{"stored": …, "submitted": …}`.
    """

    @property
    def differences(self) -> dict[str, dict[str, Any]]:
        return dict(self.body.get("differences", {}))


class Throttled(ProblemError):
    """429 still answered after every retry (each retry re-sent the same operation ID)."""


class ServerError(ProblemError):
    """5xx still answered after every retry (each retry re-sent the same operation ID)."""


class LedgerUnavailable(LedgerError):
    """No answer from the ledger after every retry (timeouts, refused or reset connections).

    The submission may or may not have been recorded: submit again with the *same*
    operation ID (never a new one) or read it with `get()` once the ledger is back.
    """

    def __init__(self, message: str, *, operation_id: str | None = None) -> None:
        super().__init__(message)
        self.operation_id = operation_id


class ProviderRejected(LedgerError):
    """Raise inside `client.reserve(...)` when the provider definitively refused the call (its
    contract says nothing happened): the outcome is reported as `failed` instead of `unknown`."""

    def __init__(self, error_class: str = "provider_rejected") -> None:
        super().__init__(error_class)
        self.error_class = error_class


class WebhookVerificationError(LedgerError):
    """A webhook whose signature, timestamp or headers do not verify. Do not process it."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: InvalidRequest,
    401: Unauthenticated,
    403: ToolNotAllowed,
    404: NotFound,
    413: InvalidRequest,
    422: ParamsConflict,
    429: Throttled,
}


def problem_for(status: int, body: Mapping[str, Any] | None, *,
                operation_id: str | None = None) -> ProblemError:
    code = str((body or {}).get("code") or str((body or {}).get("type", "")).rsplit("/", 1)[-1])
    if status == 409 and code == "stale_fencing_token":
        cls: type[ProblemError] = StaleFencingToken
    elif status >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(status, ProblemError)
    return cls(status, body, operation_id=operation_id)
