from __future__ import annotations

import json
import os
import sys

from mcp import Client, StdioServerParameters


def stdio_params(url: str, token: str, *extra: str) -> StdioServerParameters:
    """`agent-ledger-mcp` as an MCP host launches it: a subprocess speaking stdio."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "agent_ledger_client.mcp_server", *extra],
        env={**os.environ, "LEDGER_URL": url, "LEDGER_TOKEN": token})


def connect(url: str, token: str, *extra: str) -> Client:
    return Client(stdio_params(url, token, *extra))


def structured(result) -> dict:
    if result.structured_content is not None:
        return dict(result.structured_content)
    return json.loads(result.content[0].text.split("\n", 1)[1])
