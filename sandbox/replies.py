"""What a handler decides to do with the connection: answer, answer late, or never answer."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def encode(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    # Close the socket without sending any HTTP response (the client sees a disconnect).
    lose_connection: bool = False
    # Sleep before answering, then run before_send (still before a single byte is written).
    delay_seconds: float = 0.0
    before_send: Callable[[], None] | None = None
    # The request body was not read: the connection cannot be reused.
    close: bool = False


LOST = Reply(status=0, lose_connection=True)


def json_reply(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status=status, body=encode(payload), headers=headers)


def error_body(
    error_type: str, message: str, code: str | None = None, *, param: str | None = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"type": error_type, "message": message}
    if code is not None:
        error["code"] = code
    if param is not None:
        error["param"] = param
    return {"error": error}


def error_reply(
    status: int,
    error_type: str,
    message: str,
    code: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    *,
    param: str | None = None,
) -> Reply:
    return json_reply(status, error_body(error_type, message, code, param=param), headers)


def not_found(message: str) -> Reply:
    return error_reply(404, "invalid_request_error", message, "resource_missing")


def invalid(message: str) -> Reply:
    return error_reply(400, "invalid_request_error", message)
