"""Python client for Agent Ledger: guarded side-effecting tools with safe retries.

    from agent_ledger_client import LedgerClient, operation_id

    with LedgerClient("http://127.0.0.1:8000", token) as ledger:
        op = ledger.submit("refund", {...}, operation_id=operation_id(
            workflow="workflow-81", subject="invoice-17", action="refund", sequence=1))
"""

from agent_ledger_client.client import AsyncLedgerClient, LedgerClient, RetryEvent
from agent_ledger_client.errors import (
    InvalidRequest,
    LedgerError,
    LedgerUnavailable,
    NotFound,
    ParamsConflict,
    ProblemError,
    ProviderRejected,
    ServerError,
    StaleFencingToken,
    Throttled,
    ToolNotAllowed,
    Unauthenticated,
    UnsafeOperationId,
    WebhookVerificationError,
)
from agent_ledger_client.ids import check_operation_id, operation_id
from agent_ledger_client.models import Claim, Lease, Operation, Run, RunPage, ToolInfo
from agent_ledger_client.reserve import AsyncReservation, Reservation
from agent_ledger_client.retry import RetryPolicy
from agent_ledger_client.webhooks import sign_webhook, verify_webhook

__all__ = [
    "AsyncLedgerClient", "AsyncReservation", "Claim", "InvalidRequest", "Lease", "LedgerClient",
    "LedgerError", "LedgerUnavailable", "NotFound", "Operation", "ParamsConflict", "ProblemError",
    "ProviderRejected", "Reservation", "RetryEvent", "RetryPolicy", "Run", "RunPage",
    "ServerError", "StaleFencingToken", "Throttled", "ToolInfo", "ToolNotAllowed",
    "Unauthenticated", "UnsafeOperationId", "WebhookVerificationError", "check_operation_id",
    "operation_id", "sign_webhook", "verify_webhook",
]
