"""A WSGI app that answers with the names in its request's environ, served by granian in
tests/trust/test_deploy_processes.py: `raw` as granian gives it, `cleaned` through
config.processes.without_process_environment (what config/granian_worker.py serves)."""

from __future__ import annotations

import json
import os
from typing import Any

from config.processes import without_process_environment


def raw(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = json.dumps(sorted(k for k in environ if isinstance(environ[k], str))).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]


cleaned = without_process_environment(raw, os.environ)
