"""Structured logs: one JSON object per line, carrying the operation ID when there is one.

Log calls pass context with `extra={"operation_id": …}`; only the fields named here are
emitted, so a stray `extra` cannot leak params, tokens or personal data into the logs.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

CONTEXT_FIELDS = (
    "request_id", "operation_id", "provider", "outcome", "case_id", "fencing_token", "task_id",
)


class RequestIdFilter(logging.Filter):
    """Puts the current request ID (config.request_id) on every record a handler writes."""

    def filter(self, record: logging.LogRecord) -> bool:
        from config.request_id import current_request_id

        if getattr(record, "request_id", None) is None:
            record.request_id = current_request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            # The exception type only: messages of provider errors may carry request data.
            entry["exception"] = record.exc_info[0].__name__ if record.exc_info[0] else None
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{name}={getattr(record, name)}"
            for name in CONTEXT_FIELDS
            if getattr(record, name, None) is not None
        )
        return f"{line} {context}" if context else line
