"""`agent-ledger-mcp`: every catalogue tool this agent may use, as a guarded MCP tool.

    agent-ledger-mcp --url http://127.0.0.1:8000 --token "$LEDGER_TOKEN"              # stdio
    agent-ledger-mcp --transport streamable-http --port 8931 --url … --token …        # HTTP /mcp

Each tool from `GET /api/v1/tools` is offered with its own JSON Schema plus a required
`operation_id` argument, and the annotations destructiveHint/idempotentHint (the same
operation_id never acts twice). `get_operation` and `list_run` are read-only. A pending or
unknown answer is a structured, non-error result that tells the model to wait and never retry
under a new operation ID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

from agent_ledger_client.client import AsyncLedgerClient
from agent_ledger_client.errors import (
    InvalidRequest,
    LedgerError,
    ParamsConflict,
    ProblemError,
    UnsafeOperationId,
)
from agent_ledger_client.ids import check_operation_id
from agent_ledger_client.models import Operation, ToolInfo

OPERATION_ID_SCHEMA = {
    "type": "string",
    "minLength": 3,
    "maxLength": 200,
    "pattern": r"^[A-Za-z0-9._~-]+(:[A-Za-z0-9._~-]+)+$",
    "description": (
        "The stable business identity of this one action, built from business keys: "
        "workflow:subject:action-sequence:vN, for example 'workflow-81:invoice-17:refund-1:v1'. "
        "Use exactly the same operation_id every time you retry or repeat this same action, even "
        "if you reword free text. Never use your tool-call ID or a random UUID. Use a new "
        "sequence number only for a genuinely new action, and a new version (…:v2) only after "
        "the previous one definitively failed."
    ),
}
UNRESOLVED_ADVICE = (
    "Do NOT call this tool again with a new operation_id: that could perform the action twice. "
    "Call get_operation with this operation_id later to learn the outcome, or repeat this exact "
    "call with the same operation_id."
)
READ_ONLY = types.ToolAnnotations(read_only_hint=True, destructive_hint=False,
                                  idempotent_hint=True, open_world_hint=False)


def mcp_tool(tool: ToolInfo) -> types.Tool:
    schema = json.loads(json.dumps(tool.params_schema))  # a private copy
    schema.setdefault("type", "object")
    properties = dict(schema.get("properties") or {})
    if "operation_id" in properties:
        raise ValueError(f"tool {tool.name} already has a parameter named operation_id")
    schema["properties"] = {"operation_id": OPERATION_ID_SCHEMA, **properties}
    schema["required"] = ["operation_id", *[n for n in schema.get("required", [])
                                            if n != "operation_id"]]
    free_text = ", ".join(tool.free_text_fields)
    description = (
        f"{tool.description.rstrip('.')}. Guarded by Agent Ledger: the same operation_id is "
        "answered from the ledger, never performed twice."
        + (f" Rewording free text ({free_text}) under the same operation_id is still the same "
           "action." if free_text else "")
    )
    return types.Tool(
        name=tool.name, description=description, input_schema=schema,
        annotations=types.ToolAnnotations(title=tool.name, read_only_hint=False,
                                          destructive_hint=True, idempotent_hint=True,
                                          open_world_hint=True))


def builtin_tools() -> list[types.Tool]:
    return [
        types.Tool(
            name="get_operation",
            description="Read the current state of an operation submitted earlier.",
            input_schema={"type": "object", "required": ["operation_id"],
                          "properties": {"operation_id": OPERATION_ID_SCHEMA}},
            annotations=READ_ONLY),
        types.Tool(
            name="list_run",
            description=("List a run's operations in order and the first unresolved one, to "
                         "resume a multi-step workflow where it stopped."),
            input_schema={"type": "object", "required": ["run_id"],
                          "properties": {"run_id": {"type": "string", "maxLength": 200}}},
            annotations=READ_ONLY),
    ]


def _result(structured: Mapping[str, Any], text: str, *,
            error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=f"{text}\n{json.dumps(structured, default=str)}")],
        structured_content=dict(structured), is_error=error)


def operation_result(op: Operation) -> types.CallToolResult:
    answer = op.for_model()
    if op.is_terminal:
        return _result(answer, op.guidance)
    answer["do_not_retry_with_new_operation_id"] = True
    answer["next_step"] = UNRESOLVED_ADVICE
    headline = ("Outcome unknown." if op.unknown else "Not finished yet.")
    return _result(answer, f"{headline} {UNRESOLVED_ADVICE}")


def problem_result(error: LedgerError) -> types.CallToolResult:
    answer: dict[str, Any] = {"error": type(error).__name__, "message": str(error)}
    if isinstance(error, ProblemError):
        answer |= {"status": error.status, "code": error.code, "detail": error.detail}
    if isinstance(error, ParamsConflict):
        answer["differences"] = error.differences
        answer["next_step"] = ("This operation_id already names a different action. If you "
                               "meant the same action, resend its original values; if it is a "
                               "new action, use the next sequence number.")
    if isinstance(error, InvalidRequest):
        answer["errors"] = error.errors
    return _result(answer, str(error), error=True)


def build_server(client: AsyncLedgerClient, *, run_id: str | None = None,
                 wait_seconds: float = 0.0) -> Server[Any]:
    """The MCP server over one agent's ledger client."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        catalogue = await client.tools()
        return types.ListToolsResult(tools=[mcp_tool(t) for t in catalogue] + builtin_tools())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        try:
            if params.name == "get_operation":
                return operation_result(await client.get(str(arguments["operation_id"])))
            if params.name == "list_run":
                run = await client.run(str(arguments["run_id"]))
                return _result({
                    "run_id": run.run_id,
                    "operations": [op.for_model() for op in run.operations],
                    "first_unresolved": run.first_unresolved.for_model()
                    if run.first_unresolved else None,
                }, f"{len(run.operations)} operation(s) in run {run.run_id}.")
            oid = check_operation_id(str(arguments.pop("operation_id", "")))
            op = await client.submit(params.name, arguments, operation_id=oid, run_id=run_id)
            if wait_seconds and not op.is_terminal:
                op = await client.wait(oid, timeout=wait_seconds)
            return operation_result(op)
        except UnsafeOperationId as exc:
            return _result({"error": "UnsafeOperationId", "message": str(exc),
                            "next_step": OPERATION_ID_SCHEMA["description"]}, str(exc),
                           error=True)
        except LedgerError as exc:
            return problem_result(exc)
        except KeyError as exc:
            return _result({"error": "missing_argument", "argument": str(exc)},
                           f"missing argument {exc}", error=True)

    return Server("agent-ledger", version="0.1.0",
                  instructions=("Side-effecting tools guarded by Agent Ledger. Give every action "
                                "a stable operation_id from business keys and reuse it on every "
                                "retry; never retry an unknown outcome under a new ID."),
                  on_list_tools=list_tools, on_call_tool=call_tool)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-ledger-mcp", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("LEDGER_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("LEDGER_TOKEN"),
                        help="the agent's bearer token (default: $LEDGER_TOKEN)")
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--run-id", default=os.environ.get("LEDGER_RUN_ID"),
                        help="run ID recorded on every submission")
    parser.add_argument("--wait", type=float, default=0.0,
                        help="seconds to wait for a pending answer before returning it")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token or $LEDGER_TOKEN is required")
    import anyio

    if args.transport == "stdio":
        anyio.run(_serve_stdio, args)
    else:
        import uvicorn

        client = AsyncLedgerClient(args.url, args.token)
        server = build_server(client, run_id=args.run_id, wait_seconds=args.wait)
        app = server.streamable_http_app(host=args.host)
        print(f"agent-ledger-mcp listening on http://{args.host}:{args.port}/mcp",
              file=sys.stderr, flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


async def _serve_stdio(args: argparse.Namespace) -> None:
    from mcp.server.stdio import stdio_server

    async with AsyncLedgerClient(args.url, args.token) as client:
        server = build_server(client, run_id=args.run_id, wait_seconds=args.wait)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    sys.exit(main())
