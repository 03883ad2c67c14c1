"""The agents' REST API (DESIGN §6.1). One view per operation; the executor does the work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger import client_execution, executor, long_poll, selectors, transitions
from ledger.api_support import problem
from ledger.auth import request_agent
from ledger.models import AgentCredential, Operation
from ledger.pacing import pace
from ledger.serializers import (
    HeartbeatResponseSerializer,
    HeartbeatSerializer,
    OperationSerializer,
    OperationSubmitSerializer,
    OutcomeSerializer,
    RunOperationsSerializer,
    RunPageQuerySerializer,
    ToolListSerializer,
    ToolSerializer,
    operation_resource,
    operation_resources,
    submit_fields_fast,
)
from ledger.tools import UnknownTool, get_tool, latest_tools


def _resource(operation: Operation, request: HttpRequest | Request, *, status_code: int,
              headers: dict[str, str] | None = None,
              claim: transitions.Claim | None = None) -> Response:
    body = operation_resource(operation, request=request, context={"claim": claim})
    response = Response(body, status=status_code, headers=headers or {})
    return response


def _retry_after(operation: Operation) -> dict[str, str]:
    seconds = pace(operation).retry_after
    return {} if seconds is None else {"Retry-After": str(seconds)}


def _pending_headers(operation: Operation, request: HttpRequest | Request) -> dict[str, str]:
    return {
        "Location": request.build_absolute_uri(
            f"/api/v1/operations/{operation.operation_id}"
        ),
        **_retry_after(operation),
    }


OUTCOME_NOT_RECORDED_DETAIL = (
    "The request reached the provider, but the ledger could not record its answer yet "
    "(its database is unavailable). Do not retry with a new operation ID: the action may "
    "have happened. Poll the Location, or submit the same request again with the same "
    "operation ID after Retry-After seconds; the ledger finds out what happened."
)


def outcome_not_recorded(request: HttpRequest | Request, operation_id: str) -> Response:
    return problem(
        503, title="Outcome not recorded yet", code="outcome_not_recorded",
        detail=OUTCOME_NOT_RECORDED_DETAIL, extra={"operation_id": operation_id},
        headers={
            "Location": request.build_absolute_uri(f"/api/v1/operations/{operation_id}"),
            "Retry-After": str(settings.LEDGER_RETRY_AFTER_SECONDS),
        },
    )
def _not_found() -> Response:
    return problem(404, title="Not found", detail="No such operation.", code="not_found")


def _invalid(errors: dict[str, Any]) -> Response:
    return problem(400, title="Invalid request", detail="The request is invalid.",
                   code="invalid", extra={"errors": errors})


def _stale(exc: client_execution.ClaimEnded) -> Response:
    return problem(409, title="Stale fencing token", detail=exc.detail,
                   code="stale_fencing_token",
                   extra={"operation_status": exc.operation.status})


class OperationSubmitApi(APIView):
    @extend_schema(
        request=OperationSubmitSerializer,
        responses={
            201: OperationSerializer,
            200: OpenApiResponse(OperationSerializer, "Replay of a terminal operation."),
            202: OpenApiResponse(OperationSerializer, "Not terminal yet; poll Location."),
            400: OpenApiResponse(description="Invalid body, operation ID or params."),
            401: OpenApiResponse(description="No or bad credential."),
            403: OpenApiResponse(description="Tool not allowed for this agent."),
            422: OpenApiResponse(description="Same operation ID, different intent params."),
            429: OpenApiResponse(description="Throttled."),
        },
        summary="Submit an intent under a stable operation ID",
    )
    def post(self, request: Request) -> Response:
        body = request.data
        data: dict[str, Any] | None = submit_fields_fast(body)
        if data is None:
            serializer = OperationSubmitSerializer(data=body)
            serializer.is_valid(raise_exception=True)
            data = serializer.validated_data
        assert isinstance(body, Mapping)  # is_valid() has refused a body that is not an object
        return submit_answer(request, request_agent(request), body, data)


def submit_answer(request: HttpRequest | Request, agent: AgentCredential,
                  body: Mapping[str, Any], data: Mapping[str, Any]) -> Response:
    """POST /api/v1/operations once the agent is known and the body's fields are valid: the
    executor's answer as a response. The view above and ledger.fast_path both answer with it."""
    try:
        submission = executor.submit(
            agent=agent,
            operation_id=data["operation_id"],
            tool_name=data["tool"],
            params=body.get("params"),
            run_id=data["run_id"],
            tool_call_id=data["tool_call_id"],
            customer_ref=data["customer_ref"],
            execute=data["execution"] == "sync",
            client=data["execution"] == "client",
        )
    except executor.InvalidSubmission as exc:
        return _invalid(exc.errors)
    except executor.ToolNotAllowed as exc:
        return problem(403, title="Tool not allowed", detail=str(exc),
                       code="tool_not_allowed")
    except executor.OutcomeNotPersisted:
        return outcome_not_recorded(request, data["operation_id"])
    except executor.ParamsConflict as exc:
        return problem(
            422, title="Operation ID reused with different intent", code="params_conflict",
            detail=(
                "This operation ID already names a different intent. Nothing was changed. "
                "Use the stored intent, or a new version of the operation ID for a new one."
            ),
            extra={"differences": exc.differences},
        )
    operation = submission.operation
    if submission.disposition is executor.Disposition.REPLAYED:
        return _resource(operation, request, status_code=status.HTTP_200_OK,
                         headers={"Idempotent-Replayed": "true"})
    if operation.is_terminal:
        return _resource(operation, request, status_code=status.HTTP_201_CREATED)
    return _resource(operation, request, status_code=status.HTTP_202_ACCEPTED,
                     headers=_pending_headers(operation, request), claim=submission.claim)


MAX_WAIT_SECONDS = 30


class OperationDetailApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter(
            "wait", {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS},
            required=False,
            description="Long-poll: answer as soon as the status changes, or after this many "
                        "seconds (0-30) with the current state. A deployment may hold a "
                        "poll for less (LEDGER_LONG_POLL_MAX_SECONDS); poll again while the "
                        "status is not terminal."
        )],
        responses={200: OperationSerializer,
                   400: OpenApiResponse(description="wait is not an integer from 0 to 30.")},
        summary="Read one operation (optionally waiting for it to change)",
    )
    def get(self, request: Request, operation_id: str) -> Response:
        raw_wait = request.query_params.get("wait", "0")
        # ASCII digits only (str.isdigit() takes "²", which int() refuses), and no more of
        # them than 30 needs (int() refuses a string of thousands of digits).
        if not (raw_wait.isascii() and raw_wait.isdigit()) or len(raw_wait.lstrip("0")) > 2 \
                or int(raw_wait) > MAX_WAIT_SECONDS:
            return _invalid({"wait": [f"must be a whole number of seconds from 0 to "
                                      f"{MAX_WAIT_SECONDS}"]})
        agent = request_agent(request)
        operation = selectors.operation_get_for_agent(agent=agent, operation_id=operation_id)
        if operation is None:
            return _not_found()
        if int(raw_wait) and not operation.is_terminal:
            operation = long_poll.wait_for_change(agent=agent, operation=operation,
                                                  seconds=int(raw_wait))
        return _resource(operation, request, status_code=200, headers=_retry_after(operation))


class OperationHeartbeatApi(APIView):
    @extend_schema(
        request=HeartbeatSerializer,
        responses={200: HeartbeatResponseSerializer,
                   404: OpenApiResponse(description="No such operation."),
                   409: OpenApiResponse(description="Stale or wrong fencing token.")},
        summary="Extend the lease of a client-executed operation's claim",
    )
    def post(self, request: Request, operation_id: str) -> Response:
        agent = request_agent(request)
        operation = selectors.operation_get_for_agent(agent=agent, operation_id=operation_id)
        if operation is None:
            return _not_found()
        serializer = HeartbeatSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            extended = client_execution.client_heartbeat(
                agent=agent, operation=operation,
                fencing_token=serializer.validated_data["fencing_token"])
        except client_execution.ClaimEnded as exc:
            return _stale(exc)
        return Response(HeartbeatResponseSerializer({
            "operation_id": extended.operation_id, "fencing_token": extended.fencing_token,
            "lease_expires_at": extended.lease_expires_at}).data)


class OperationOutcomeApi(APIView):
    @extend_schema(
        request=OutcomeSerializer,
        responses={200: OperationSerializer,
                   400: OpenApiResponse(description="Invalid body (failed needs error_class)."),
                   404: OpenApiResponse(description="No such operation."),
                   409: OpenApiResponse(description="Stale or wrong fencing token; the report "
                                                    "was kept as evidence, not applied.")},
        summary="Report the outcome of a client-executed operation",
    )
    def post(self, request: Request, operation_id: str) -> Response:
        agent = request_agent(request)
        operation = selectors.operation_get_for_agent(agent=agent, operation_id=operation_id)
        if operation is None:
            return _not_found()
        serializer = OutcomeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data: dict[str, Any] = serializer.validated_data
        try:
            reported = client_execution.client_report_outcome(
                agent=agent, operation=operation, fencing_token=data["fencing_token"],
                status=data["status"], result=data["result"],
                provider_reference=data["provider_reference"], error_class=data["error_class"])
        except client_execution.ClaimEnded as exc:
            return _stale(exc)
        # Re-read with its case: an unknown report opened one in the same commit.
        current = selectors.operation_get_for_agent(agent=agent, operation_id=operation_id)
        current = current or reported
        return _resource(current, request, status_code=200, headers=_retry_after(current))


RUN_PAGE_DEFAULT = 50
RUN_PAGE_MAX = 200


def encode_run_cursor(last_pk: int) -> str:
    """The keyset cursor: opaque to clients (they follow `next`), `v1.<last row's key>`."""
    return f"v1.{last_pk}"


def decode_run_cursor(cursor: str) -> int:
    return int(cursor.removeprefix("v1."))  # the serializer has checked RUN_CURSOR_PATTERN


class RunOperationsApi(APIView):
    @extend_schema(
        parameters=[RunPageQuerySerializer],
        responses={200: RunOperationsSerializer},
        summary="A run's operations in order (one page), and the first unresolved one",
        description=(
            "Pages are bounded (`limit`, default 50, at most 200) and keyset-paginated: follow "
            "`next` until it is null. `count` is the number of operations in this page. "
            "`first_unresolved` is the run's first operation that is not terminal, on every "
            "page, found without reading the run."
        ),
    )
    def get(self, request: Request, run_id: str) -> Response:
        # A plain dict: DRF reads an empty form value of an optional field as "not given".
        page_query = RunPageQuerySerializer(data=request.query_params.dict())
        page_query.is_valid(raise_exception=True)
        limit: int = page_query.validated_data["limit"]
        after = page_query.validated_data.get("after")
        agent = request_agent(request)
        rows = selectors.operation_list_for_run(agent=agent, run_id=run_id)
        if after:
            rows = rows.filter(pk__gt=decode_run_cursor(after))
        page = list(rows[: limit + 1])
        more = len(page) > limit
        page = page[:limit]
        first_unresolved = selectors.operation_first_unresolved_in_run(agent=agent, run_id=run_id)
        next_url = None
        if more:
            query = urlencode({"limit": limit, "after": encode_run_cursor(page[-1].pk)})
            next_url = request.build_absolute_uri(f"{request.path}?{query}")
        return Response({
            "run_id": run_id,
            "count": len(page),
            "operations": operation_resources(page, request=request),
            "first_unresolved": operation_resource(first_unresolved, request=request)
            if first_unresolved else None,
            "next": next_url,
        })


class ToolListApi(APIView):
    @extend_schema(responses={200: ToolListSerializer}, operation_id="tools_list",
                   summary="The tools this agent may use, at the version new operations get")
    def get(self, request: Request) -> Response:
        agent = request_agent(request)
        return Response({"tools": [tool.resource() for tool in latest_tools()
                                   if agent.may_use(tool.name)]})


class ToolDetailApi(APIView):
    @extend_schema(
        responses={200: ToolSerializer,
                   404: OpenApiResponse(description="No such tool, or not for this agent.")},
        operation_id="tools_retrieve",
        summary="One tool this agent may use",
    )
    def get(self, request: Request, name: str) -> Response:
        agent = request_agent(request)
        try:
            tool = get_tool(name)
        except UnknownTool:
            tool = None
        if tool is None or not agent.may_use(tool.name):
            # The same answer either way: an agent learns nothing about tools it may not use.
            return problem(404, title="Not found", detail="No such tool.", code="not_found")
        return Response(tool.resource())
