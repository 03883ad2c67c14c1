"""Strict JSON parsing and the project-wide problem+json exception handler."""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body is too large."
    default_code = "payload_too_large"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# Deeper than any request this API takes; refused before anything walks it recursively.
MAX_JSON_DEPTH = 32


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode text)"
    return None


def check_json_document(document: Any) -> None:
    """Refuse what JSON allows but no field of this API can hold: nesting deeper than
    MAX_JSON_DEPTH, NUL characters and lone surrogates (\\ud800) in any key or string.
    Iterative, so a hostile document cannot exhaust the stack."""
    stack: list[tuple[Any, int, str]] = [(document, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise exceptions.ParseError(f"JSON is nested deeper than {MAX_JSON_DEPTH} levels.")
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem:
                raise exceptions.ParseError(f"The string at '{path or '/'}' {problem}.")
        elif isinstance(value, dict):
            for key, item in value.items():
                problem = _text_problem(key)
                if problem:
                    raise exceptions.ParseError(f"A key in '{path or '/'}' {problem}.")
                stack.append((item, depth + 1, f"{path}/{key}"))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, f"{path}/{i}") for i, item in enumerate(value))


class StrictJSONParser(BaseParser):
    """JSON with no NaN/Infinity, floats kept as Decimal so validation can refuse them for
    money instead of silently rounding, and a body size limit DRF does not apply itself."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"Request body is larger than {limit} bytes.")
        return parse_json(raw)


def parse_json(raw: bytes) -> Any:
    """A request body as StrictJSONParser reads it; ParseError for anything it refuses."""
    try:
        document = json.loads(
            raw.decode("utf-8"), parse_float=Decimal, parse_constant=_reject_constant
        )
    except RecursionError:
        raise exceptions.ParseError(
            f"JSON is nested deeper than {MAX_JSON_DEPTH} levels.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise exceptions.ParseError(f"Malformed JSON: {exc}") from None
    check_json_document(document)
    return document


class DomainProblem(exceptions.APIException):
    """An API error with a problem type and extra members (RFC 9457)."""

    def __init__(self, *, status_code: int, title: str, detail: str, code: str,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.title = title
        self.extra = extra or {}


def problem(status_code: int, *, title: str, detail: Any, code: str,
            extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Response:
    body = {
        "type": f"https://agent-ledger.invalid/problems/{code}",
        "title": title,
        "status": status_code,
        "detail": detail,
        "code": code,
        **(extra or {}),
    }
    response = Response(body, status=status_code, headers=headers,
                        content_type=PROBLEM_CONTENT_TYPE)
    return response


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainProblem):
        codes = exc.get_codes()
        return problem(exc.status_code, title=exc.title, detail=str(exc.detail),
                       code=codes if isinstance(codes, str) else "error",
                       extra=exc.extra)
    if isinstance(exc, OperationalError | InterfaceError):
        logger.error("database unavailable", exc_info=exc)
        return problem(
            503, title="Service unavailable", code="unavailable",
            detail=("The ledger's database is unavailable. If you submitted an operation, do "
                    "not retry it under a new operation ID: send the same request again with "
                    "the same operation ID after Retry-After seconds."),
            headers={"Retry-After": str(settings.LEDGER_RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.APIException):
        code = exc.default_code
        detail: object = exc.detail
        if isinstance(exc, exceptions.ValidationError):
            title, extra, detail = "Invalid request", {"errors": detail}, "The request is invalid."
        else:
            title, extra = str(exc.default_detail), {}
            detail = str(detail)
        headers = {k: v for k, v in response.headers.items() if k in {"WWW-Authenticate",
                                                                      "Retry-After"}}
        return problem(response.status_code, title=title, detail=detail, code=str(code),
                       extra=extra, headers=headers)
    return response

