"""An e-mail provider: a minimal ESMTP listener (RFC 5321 subset) and the message-search API an
ESP offers over its delivery logs.

SMTP, on the port given by `--smtp-port`:
    EHLO/HELO, MAIL FROM, RCPT TO, DATA (dot-stuffing), RSET, NOOP, QUIT; VRFY answers 252,
    EXPN and HELP 502, anything else 500. Extensions: 8BITMIME, SMTPUTF8, SIZE.
GET /v1/messages?message_id=<Message-ID>    the delivery log, newest first, behind the same index
GET /v1/messages?reference=<operation id>   lag as every other lookup

A message accepted after DATA is an effect of kind `smtp.email` whose reference is its
X-Operation-Id header, so the effects log counts deliveries. SMTP has no idempotency keys and
a real server does not deduplicate: the same message sent twice is delivered twice.

Execution reuses sandbox.effects (its Attempt, without a key): the same fault scenarios, chaos
and commit. Magic values count as whole words of the Subject or of the text body, and say when,
in SMTP's terms, things go wrong:

    lose-response       commit, then hang up instead of the final 250
    timeout             commit, then send the 250 only after SANDBOX_TIMEOUT_SLEEP_SECONDS
    drop-before-commit  hang up at the end of DATA, nothing stored
    reject              550 5.7.1 after DATA, nothing stored
    rate-limit          451 4.7.1 after DATA, nothing stored
    500-after-commit    commit, then 451 4.3.0 — a temporary failure for a delivered message
    lookup-lag-N        commit normally; the search API cannot see it for N seconds

The Subject and body are only known after DATA, so a refusal at RCPT TO is chosen the way
mailbox simulators choose it, by the recipient: a local part of `"sandbox:reject"` answers
`550 5.7.1 rejected by the sandbox`, one of `"sandbox:rate-limit"` answers 451 4.7.1.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import socketserver
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any, NoReturn

from sandbox import store
from sandbox.app import Sandbox
from sandbox.config import MAGIC_PREFIX
from sandbox.effects import Attempt, Dialect, EffectRequest
from sandbox.replies import Reply, invalid, json_reply, new_id

KIND = "smtp.email"
KINDS = frozenset({KIND})
MESSAGES = "/v1/messages"
HOSTNAME = "sandbox.invalid"

# RFC 5321 §4.5.3.1: 512 octets for a command line, 1000 for a text line. DATA lines are read in
# chunks of that size, so a longer line is accepted, not refused.
MAX_COMMAND_LINE = 512
MAX_TEXT_LINE = 1000
MAX_MESSAGE_BYTES = 1 << 20
MAX_RECIPIENTS = 100
MAX_LISTED_MESSAGES = 100
IDLE_TIMEOUT_SECONDS = 60
SEARCH_PARAMS = frozenset({"message_id", "reference"})
MAIL_PARAMETERS = frozenset({("BODY", "7BIT"), ("BODY", "8BITMIME"), ("SMTPUTF8", "")})

# Faults a recipient address can choose; they are answered at RCPT TO.
RECIPIENT_FAULTS = {
    "reject": "550 5.7.1 rejected by the sandbox",
    "rate-limit": "451 4.7.1 rate limited, try again later",
}
_PATH = re.compile(r"(?i)(FROM|TO):\s*<([^<>]*)>\s*(.*)")
_PARSER = BytesParser(policy=policy.default)


# --- deliveries as effects ---------------------------------------------------------------------


def render_message(request: EffectRequest, message_id: str, now: float) -> dict[str, Any]:
    return {
        "id": message_id,
        "object": "message",
        **request.params["message"],
        "status": "delivered",
        "created": now,
    }


# Messages carry no key, so the key-mismatch branch is never reached; the success reply carries
# the SMTP code (250) where the HTTP dialects carry 201 or 200.
SMTP = Dialect(
    id_prefix="msg_",
    render=render_message,
    created_status=250,
    mismatch_status=400,
    rejection_code="sandbox_rejected",
    rejection_message="rejected by the sandbox",
    replays_server_errors=False,
)


@dataclass
class Envelope:
    helo: str = ""
    esmtp: bool = False
    sender: str | None = None
    recipients: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.sender = None
        self.recipients = []


def _header(message: EmailMessage, name: str) -> str:
    value = message.get(name)
    return "" if value is None else str(value).strip()


def _body_text(message: EmailMessage) -> str:
    texts = []
    for part in message.walk():
        if part.get_content_maintype() != "text":
            continue
        try:
            texts.append(str(part.get_content()))
        except (LookupError, ValueError):
            continue  # an unknown charset or a broken encoding: nothing to scan
    return "\n".join(texts)


def read_message(envelope: Envelope, raw: bytes) -> tuple[dict[str, Any], list[str]]:
    """What the delivery log keeps about a message, and the words a fault may hide in."""
    message = _PARSER.parsebytes(raw)
    assert isinstance(message, EmailMessage)
    subject = _header(message, "Subject")
    fields = {
        "message_id": _header(message, "Message-ID"),
        "reference": _header(message, "X-Operation-Id"),
        "to": ", ".join(envelope.recipients),
        "subject": subject,
        "template": _header(message, "X-Template"),
        "size": len(raw),
    }
    return fields, subject.split() + _body_text(message).split()


def deliver(sandbox: Sandbox, envelope: Envelope, raw: bytes) -> Reply:
    fields, words = read_message(envelope, raw)
    # Words first: the scan for a magic value is depth-first, in order.
    request = EffectRequest(KIND, fields["reference"], {"words": words, "message": fields}, None)
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        # Counted before anything can fail, so a test can prove whether a message was offered.
        seq = store.record_request(
            conn, kind=KIND, reference=fields["reference"] or None, has_key=False, received=now
        )
        return Attempt(sandbox, conn, request, now, seq, new_id("req_"), SMTP).run()


def final_reply(reply: Reply) -> str | None:
    """The SMTP answer to the end of DATA for what the shared machinery decided (None: hang
    up without one)."""
    if reply.lose_connection:
        return None
    if reply.status == SMTP.created_status:
        return f"250 2.0.0 OK queued as {json.loads(reply.body)['id']}"
    if reply.status == 402:
        return "550 5.7.1 rejected by the sandbox"
    if reply.status == 429:
        return "451 4.7.1 rate limited, try again later"
    # 500-after-commit (the message *was* delivered) and internal errors alike.
    return "451 4.3.0 local error in processing"


def recipient_fault(address: str) -> str | None:
    local = address.rpartition("@")[0]
    if len(local) >= 2 and local[0] == local[-1] == '"':
        local = local[1:-1]
    name = local.removeprefix(MAGIC_PREFIX) if local.startswith(MAGIC_PREFIX) else ""
    return name if name in RECIPIENT_FAULTS else None


def record_refusal(sandbox: Sandbox, fault: str) -> None:
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        seq = store.record_request(conn, kind=KIND, reference=None, has_key=False, received=now)
        store.set_request_fault(conn, seq, fault)


# --- the message-search API --------------------------------------------------------------------


def list_messages(sandbox: Sandbox, query: Mapping[str, str]) -> Reply:
    unknown = sorted(set(query) - SEARCH_PARAMS)
    if unknown:
        return invalid(f"unknown parameter: {unknown[0][:60]}")
    matching = {name: query[name] for name in sorted(SEARCH_PARAMS) if query.get(name)}
    if not matching:
        return invalid("give message_id or reference")
    if "message_id" in matching and not matching["message_id"].startswith("<"):
        # Stored as the header spells it; the brackets are optional in a search.
        matching["message_id"] = f"<{matching['message_id']}>"
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        data, has_more = store.visible_page(
            conn,
            kinds=KINDS,
            matching=matching,
            now=now,
            index_lag=sandbox.config.index_lag_seconds,
            starting_after=None,
            limit=MAX_LISTED_MESSAGES,
        )
    return json_reply(200, {"object": "list", "data": data, "has_more": has_more})


# --- the SMTP session --------------------------------------------------------------------------


class SmtpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        super().__init__(address, SmtpHandler)


class _Hangup(Exception):
    """The client went away, stayed silent too long, or asked to QUIT."""


class SmtpHandler(socketserver.StreamRequestHandler):
    server: SmtpServer
    timeout = IDLE_TIMEOUT_SECONDS
    # Each reply is one write, but with Nagle on a reply could wait for the client's ACK.
    disable_nagle_algorithm = True

    def handle(self) -> None:
        self.envelope = Envelope()
        commands: dict[str, Callable[[str], None]] = {
            "EHLO": self.ehlo, "HELO": self.helo, "MAIL": self.mail, "RCPT": self.rcpt,
            "DATA": self.data, "RSET": self.rset, "NOOP": self.noop, "QUIT": self.quit,
            "VRFY": self.vrfy, "EXPN": self.not_implemented, "HELP": self.not_implemented,
        }
        try:
            self.reply(f"220 {HOSTNAME} ESMTP AgentLedgerSandbox")
            while True:
                line = self.read_command()
                if line is None:
                    continue
                verb, _, argument = line.partition(" ")
                command = commands.get(verb.upper())
                if command is None:
                    self.reply("500 5.5.2 command not recognised")
                else:
                    command(argument.strip())
        except _Hangup:
            pass

    # --- I/O -----------------------------------------------------------------------------------

    def reply(self, *lines: str) -> None:
        text = "".join(
            f"{line[:3]}{'-' if i < len(lines) - 1 else ' '}{line[4:]}\r\n"
            for i, line in enumerate(lines)
        )
        try:
            self.wfile.write(text.encode("utf-8"))
        except OSError:
            raise _Hangup from None

    def read_line(self, limit: int) -> bytes:
        try:
            line = self.rfile.readline(limit)
        except TimeoutError:
            self.reply(f"421 4.4.2 {HOSTNAME} idle too long, closing")
            raise _Hangup from None
        except OSError:
            raise _Hangup from None
        if not line:
            raise _Hangup
        return line

    def read_command(self) -> str | None:
        """The next command line, or None if it was too long (and has been answered)."""
        line = self.read_line(MAX_COMMAND_LINE + 1)
        if not line.endswith(b"\n"):
            while not line.endswith(b"\n"):
                line = self.read_line(MAX_TEXT_LINE)
            self.reply("500 5.5.2 line too long")
            return None
        return line.rstrip(b"\r\n").decode("utf-8", errors="replace")

    def read_payload(self) -> bytes | None:
        """The message up to the lone dot, with the dot-stuffing undone; None if it exceeded
        the size limit (it was read to the end all the same)."""
        chunks: list[bytes] = []
        size, at_line_start = 0, True
        while True:
            line = self.read_line(MAX_TEXT_LINE)
            if at_line_start and line in (b".\r\n", b".\n"):
                break
            if at_line_start and line.startswith(b"."):
                line = line[1:]
            at_line_start = line.endswith(b"\n")
            size += len(line)
            if size <= MAX_MESSAGE_BYTES:
                chunks.append(line)
        return b"".join(chunks) if size <= MAX_MESSAGE_BYTES else None

    def hang_up(self) -> NoReturn:
        # No reply at all: the client sees the connection close under it.
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        raise _Hangup

    # --- commands ------------------------------------------------------------------------------

    def ehlo(self, argument: str) -> None:
        if not argument:
            self.reply("501 5.5.4 EHLO needs a domain")
            return
        self.envelope = Envelope(helo=argument, esmtp=True)
        self.reply(f"250 {HOSTNAME} greets {argument[:64]}", "250 8BITMIME", "250 SMTPUTF8",
                   f"250 SIZE {MAX_MESSAGE_BYTES}")

    def helo(self, argument: str) -> None:
        if not argument:
            self.reply("501 5.5.4 HELO needs a domain")
            return
        self.envelope = Envelope(helo=argument)
        self.reply(f"250 {HOSTNAME}")

    def mail(self, argument: str) -> None:
        envelope = self.envelope
        if not envelope.helo:
            self.reply("503 5.5.1 send HELO or EHLO first")
            return
        if envelope.sender is not None:
            self.reply("503 5.5.1 nested MAIL command")
            return
        match = _PATH.fullmatch(argument)
        if match is None or match.group(1).upper() != "FROM":
            self.reply("501 5.5.4 syntax: MAIL FROM:<address>")
            return
        problem = self._mail_parameters(match.group(3).split())
        if problem:
            self.reply(problem)
            return
        envelope.sender = match.group(2)
        self.reply("250 2.1.0 OK")

    def _mail_parameters(self, parameters: list[str]) -> str | None:
        if parameters and not self.envelope.esmtp:
            return "555 5.5.4 parameters need EHLO"
        for parameter in parameters:
            name, _, value = parameter.upper().partition("=")
            if name == "SIZE" and value.isdigit():
                if int(value) > MAX_MESSAGE_BYTES:
                    return "552 5.3.4 message too big"
            elif (name, value) not in MAIL_PARAMETERS:
                return f"555 5.5.4 unsupported parameter {name[:20]}"
        return None

    def rcpt(self, argument: str) -> None:
        envelope = self.envelope
        if envelope.sender is None:
            self.reply("503 5.5.1 need MAIL command")
            return
        match = _PATH.fullmatch(argument)
        if match is None or match.group(1).upper() != "TO" or match.group(3):
            self.reply("501 5.5.4 syntax: RCPT TO:<address>")
            return
        address = match.group(2)
        if "@" not in address:
            self.reply("501 5.1.3 bad recipient address syntax")
            return
        if len(envelope.recipients) >= MAX_RECIPIENTS:
            self.reply("452 4.5.3 too many recipients")
            return
        fault = recipient_fault(address)
        if fault is not None:
            record_refusal(self.server.sandbox, fault)
            self.reply(RECIPIENT_FAULTS[fault])
            return
        envelope.recipients.append(address)
        self.reply("250 2.1.5 OK")

    def data(self, argument: str) -> None:
        if argument:
            self.reply("501 5.5.4 DATA takes no arguments")
            return
        if not self.envelope.recipients:
            self.reply("503 5.5.1 need RCPT command")
            return
        self.reply("354 end data with <CR><LF>.<CR><LF>")
        started = time.monotonic()
        # A client that hangs up before the dot has sent no message: nothing is stored.
        raw = self.read_payload()
        envelope, self.envelope = self.envelope, Envelope(self.envelope.helo, self.envelope.esmtp)
        if raw is None:
            self.reply("552 5.3.4 message too big")
            return
        try:
            answer = deliver(self.server.sandbox, envelope, raw)
        except Exception:
            # The traceback goes to the operator's log; the client learns nothing internal.
            traceback.print_exc(file=sys.stderr)
            answer = Reply(status=500)
        self._answer(answer, started)

    def _answer(self, answer: Reply, started: float) -> None:
        if answer.delay_seconds:
            time.sleep(answer.delay_seconds)
        if answer.before_send is not None:
            answer.before_send()
        text = final_reply(answer)
        sys.stderr.write(f"sandbox SMTP DATA {text[:3] if text else 'lost'} "
                         f"{(time.monotonic() - started) * 1000:.0f}ms\n")
        if text is None:
            self.hang_up()
        # After a `timeout` the caller is usually gone; the outcome stands regardless.
        self.reply(text)

    def rset(self, argument: str) -> None:
        self.envelope.reset()
        self.reply("250 2.0.0 OK")

    def noop(self, argument: str) -> None:
        self.reply("250 2.0.0 OK")

    def vrfy(self, argument: str) -> None:
        self.reply("252 2.1.5 cannot VRFY, but will accept the message")

    def not_implemented(self, argument: str) -> None:
        self.reply("502 5.5.1 command not implemented")

    def quit(self, argument: str) -> None:
        self.reply(f"221 2.0.0 {HOSTNAME} closing")
        raise _Hangup


def make_smtp_server(host: str, port: int, sandbox: Sandbox) -> SmtpServer:
    return SmtpServer((host, port), sandbox)
