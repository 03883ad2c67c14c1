"""The ledger's signals, handled inside the ledger's own transactions.

So an operation that becomes unknown has its case in the same commit, an operation that is
resolved has its case resolved in the same commit, and a late result from a superseded attempt
lands on the case as evidence in the same commit as the ledger's own event.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from ledger.models import Operation
from ledger.transitions import (
    operation_became_unknown,
    operation_resolved,
    operation_stale_result,
)
from reconciliation import transitions
from reconciliation.models import Case
from reconciliation.reconciler import contradicts


@receiver(operation_became_unknown)
def open_case(sender: Any, *, operation: Operation, reason: str, error_class: str,
              **kwargs: Any) -> None:
    transitions.case_open(operation=operation, reason=reason, error_class=error_class,
                          actor="ledger")


@receiver(operation_resolved)
def close_case(sender: Any, *, operation: Operation, actor: str, reason: str,
               **kwargs: Any) -> None:
    transitions.case_close_for_operation(operation=operation, actor=actor, reason=reason)


@receiver(operation_stale_result)
def keep_stale_result(sender: Any, *, operation: Operation, fencing_token: int, outcome: str,
                      data: dict[str, Any], actor: str, **kwargs: Any) -> None:
    case = Case.objects.filter(operation=operation).first()
    if case is None:
        return
    evidence = {"fencing_token": fencing_token, "current_fencing_token": operation.fencing_token,
                "operation_status": operation.status}
    transitions.case_record_evidence(
        case=case, kind="stale_result", request=evidence, response=data,
        outcome=outcome.lower(), actor=actor)
    if case.state == Case.State.RESOLVED:
        if contradicts(resolved_as=operation.status, send_outcome=outcome):
            transitions.case_flag(case=case, actor=actor, reason="contradicting_evidence",
                                  data={"kind": "stale_result", "outcome": outcome, **evidence})
    elif case.state == Case.State.CHECKING:
        # A worker we had given up on answered after all: look at the provider again now.
        transitions.case_check_soon(case=case, actor=actor, reason="stale_result_received",
                                    data={"outcome": outcome, **evidence})
