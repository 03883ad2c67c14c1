from __future__ import annotations

from celery import shared_task

from ledger import dispatch, executor, webhooks
from ledger.models import Operation


@dispatch.register("execute_operation")
@shared_task(acks_late=True, ignore_result=True)
def execute_operation(operation_pk: int) -> str:
    """Send an operation that was recorded for asynchronous execution. Safe to run twice: the
    claim lets one worker send, and a non-prepared row is left alone."""
    operation = Operation.objects.get(pk=operation_pk)
    if operation.status != Operation.Status.PREPARED:
        return operation.status
    return executor.execute_prepared(operation).status


@shared_task(acks_late=True, ignore_result=True)
def retry_unsent_operations() -> int:
    return executor.retry_unsent()


@dispatch.register("deliver_webhook")
@shared_task(acks_late=True, ignore_result=True)
def deliver_webhook(delivery_pk: int) -> str:
    """One attempt of one webhook delivery. Safe to run twice: the claim lets one worker POST,
    and a delivery that is not due is left alone."""
    return webhooks.deliver(delivery_pk)


@shared_task(ignore_result=True)
def sweep_webhooks() -> int:
    return webhooks.sweep_due()
