"""E-mail over SMTP (the standard library's smtplib), classified with the same discipline as the
generic HTTP adapter (ledger.providers.http).

SMTP has no idempotency keys: a server that accepted a message delivers it again when it is
sent again. The Message-ID is derived from the operation's key, so every attempt carries the
same one and a lookup can find it, but it deduplicates nothing. So the adapter never re-sends on
its own, and its classification answers one question: could the server have taken
responsibility for the message? A server takes it when it answers 250 to the end of the DATA
payload, and it cannot take it before it has read the payload's terminating dot (RFC 5321
§4.1.1.4, §3.3). The transaction is therefore run with smtplib's low-level calls, phase by
phase, and the phase that failed decides:

    phase (in the error class)      what happened                      outcome
    connect, ehlo                   refused, DNS, timeout, 4xx/5xx     NotSent
    mail, rcpt, data (the command)  5xx                                Rejected
                                    4xx, timeout, disconnect           NotSent
    payload (writing it)            write error or timeout             NotSent
    data_end (reply to the dot)     250                                Confirmed
                                    5xx                                Rejected
                                    4xx                                Unknown(ambiguous_response)
                                    timeout                            Unknown(timeout_after_send)
                                    disconnect, reset                  Unknown(connection_reset)
                                    unreadable reply                   Unknown(ambiguous_response)

A greeting or EHLO/HELO refusal is NotSent even when it is a 5xx: the server refused the session,
not this message, nothing of the message was offered, and it may take it once the operator has
fixed the relay. A failed payload write is NotSent because `sendall` raising means its tail —
the terminating dot — was never handed to the network, and without the dot there is no message.

A 4xx after the dot is Unknown, not NotSent. By the RFC a 4xx means the server did not take the
message, but that is its word, not a proof: a relay or proxy in front of the MTA that times out
on an MTA which already queued the message answers exactly that (451 4.3.0), and a retry then
delivers a second copy. The sandbox reproduces it with `sandbox:500-after-commit`. NotSent would
let the unsent sweeper send again automatically; Unknown costs only a lookup by Message-ID, which
this provider answers authoritatively: found → succeeded, absent after the window → failed.

`timeout` bounds the whole call. Before the dot, running out of time is NotSent; after it, what
is left of the budget is how long the adapter waits for the 250.

Error classes are the phase and the reply code with its enhanced status code
(`smtp.rcpt.550.5.7.1`), or the phase and an exception class (`smtp.connect.ConnectionRefusedError`,
`smtp.data_end.TimeoutError`): never the server's reply text.
"""

from __future__ import annotations

import contextlib
import logging
import re
import smtplib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email import policy
from email.errors import MessageError
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import TYPE_CHECKING, Any

import httpx

from ledger import metrics
from ledger.providers.base import (
    Capabilities,
    Confirmed,
    Found,
    LookupOutcome,
    NotFound,
    NotSent,
    Rejected,
    SendOutcome,
    Unavailable,
    Unknown,
    UnknownReason,
)
from ledger.providers.config import ConnectorConfigError, Secret, SettingsReader
from ledger.providers.http import ConnectorContext

if TYPE_CHECKING:
    from ledger.models import Operation

logger = logging.getLogger(__name__)

MESSAGE_ID_DOMAIN = "agent-ledger.invalid"
CONNECT_TIMEOUT_SECONDS = 3.0
QUIT_TIMEOUT_SECONDS = 1.0
# settimeout(0) would make the socket non-blocking rather than "no time left".
MIN_WAIT_SECONDS = 0.01
_QUEUE_ID = re.compile(rb"queued as ([A-Za-z0-9_.-]{1,64})")
_ENHANCED_CODE = re.compile(rb"([245]\.\d{1,3}\.\d{1,3})(?:\s|$)")
# Quoted-printable or base64 bodies need no 8BITMIME from the relay.
_ASCII_POLICY = policy.SMTP.clone(cte_type="7bit")
_UTF8_POLICY = policy.SMTPUTF8.clone(cte_type="7bit")
# What the message search says, in the reconciler's vocabulary.
_STATUSES = {"delivered": "succeeded", "sent": "succeeded", "queued": "pending",
             "deferred": "pending"}

CAPABILITIES = Capabilities(
    honours_idempotency_keys=False,
    key_retention_seconds=None,
    # Lookups go by the Message-ID, which the operation's key determines (a key equivalent);
    # the delivery log also carries our reference (X-Operation-Id) for the reconciler to verify.
    lookup_by_request_id=False,
    lookup_by_key=True,
    lookup_by_reference=True,
    lookup_consistency_seconds=30.0,
    # The sandbox ESP's log holds every accepted message once its index caught up.
    authoritative_absence=True,
)


# No delivery log to search: no keys, no lookups, so an ambiguous send always goes to a person.
NO_SEARCH_CAPABILITIES = Capabilities(
    honours_idempotency_keys=False,
    key_retention_seconds=None,
    lookup_by_request_id=False,
    lookup_by_key=False,
    lookup_by_reference=False,
    lookup_consistency_seconds=0.0,
    authoritative_absence=False,
)

TLS_MODES = ("none", "starttls", "implicit")


@dataclass(frozen=True)
class Security:
    tls: str = "none"
    credentials: tuple[Secret, Secret] | None = field(default=None, repr=False)


def message_id_for(key: str) -> str:
    """The same for every attempt of an operation (and only of that operation)."""
    return f"<{key}@{MESSAGE_ID_DOMAIN}>"


# --- the message -------------------------------------------------------------------------------


class InvalidMessage(ValueError):
    """The intent cannot be written as a message; nothing was sent."""


@dataclass(frozen=True)
class Envelope:
    sender: str
    recipient: str
    message_id: str
    # The message dot-stuffed and ended with <CRLF>.<CRLF>: exactly what follows the 354.
    payload: bytes
    smtputf8: bool


def _is_addr_spec(address: str) -> bool:
    # What smtplib would put between the angle brackets must be the address the intent names.
    return "@" in address and parseaddr(address) == ("", address)


def dot_stuffed(message: bytes) -> bytes:
    stuffed = re.sub(rb"(?m)^\.", b"..", message)
    if not stuffed.endswith(b"\r\n"):
        stuffed += b"\r\n"
    return stuffed + b".\r\n"


def build_envelope(operation: Operation, *, key: str, sender: str) -> Envelope:
    intent = operation.intent_params
    recipient = str(intent["to"])
    for address in (sender, recipient):
        if not _is_addr_spec(address):
            raise InvalidMessage("address")
    smtputf8 = not (sender + recipient).isascii()
    message = EmailMessage(policy=_UTF8_POLICY if smtputf8 else _ASCII_POLICY)
    try:
        message["From"] = sender
        message["To"] = recipient
        message["Subject"] = str(intent["subject"])
        message["Date"] = formatdate(usegmt=True)
        message["Message-ID"] = message_id_for(key)
        message["X-Operation-Id"] = operation.operation_id
        message["X-Template"] = str(intent["template"])
        message.set_content(str(operation.params.get("body") or ""))
        raw = message.as_bytes()
    except (ValueError, MessageError):
        # A line break in the subject, say: written out it would be another header (an
        # injected Bcc), so the message is refused here and no server ever sees it.
        raise InvalidMessage("header") from None
    return Envelope(sender, recipient, message_id_for(key), dot_stuffed(raw), smtputf8)


# --- classification ----------------------------------------------------------------------------


def reply_class(code: int, reply: bytes) -> str:
    """`550.5.7.1`: the reply code and, if the server gave one, its enhanced status code."""
    if code < 0:
        return "unreadable"
    enhanced = _ENHANCED_CODE.match(reply)
    return f"{code}.{enhanced.group(1).decode()}" if enhanced else str(code)


def failure_name(exc: BaseException) -> str:
    """The exception class, or for smtplib's "disconnected" the socket error behind it."""
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        context = exc.__cause__ or exc.__context__
        return type(context).__name__ if isinstance(context, OSError) else "disconnected"
    return type(exc).__name__


def classify_refusal(phase: str, code: int, reply: bytes) -> SendOutcome:
    """A reply other than the expected one before the payload: nothing was accepted."""
    error_class = f"smtp.{phase}.{reply_class(code, reply)}"
    if 500 <= code < 600 and phase in {"mail", "rcpt", "data"}:
        return Rejected(error_class=error_class, detail={"phase": phase, "code": code})
    return NotSent(error_class=error_class)


def classify_final_reply(code: int, reply: bytes) -> SendOutcome | None:
    """The reply to the terminating dot; None means accepted (the caller confirms)."""
    if 200 <= code < 300:
        return None
    error_class = f"smtp.data_end.{reply_class(code, reply)}"
    if 500 <= code < 600:
        return Rejected(error_class=error_class, detail={"phase": "data_end", "code": code})
    # 4xx (see the module docstring) and anything a server should not say here.
    return Unknown(error_class=error_class, reason=UnknownReason.AMBIGUOUS_RESPONSE)


def classify_lost_reply(exc: Exception) -> Unknown:
    """No reply to the terminating dot: the server may have taken the message."""
    error_class = f"smtp.data_end.{failure_name(exc)}"
    context = exc.__cause__ or exc.__context__
    if isinstance(exc, TimeoutError) or isinstance(context, TimeoutError):
        return Unknown(error_class=error_class, reason=UnknownReason.TIMEOUT_AFTER_SEND)
    if isinstance(exc, smtplib.SMTPResponseException):
        # smtplib's own complaint about an unreadable reply (a "500" that no server sent).
        return Unknown(error_class=error_class, reason=UnknownReason.AMBIGUOUS_RESPONSE)
    return Unknown(error_class=error_class, reason=UnknownReason.CONNECTION_RESET)


# --- one SMTP transaction ----------------------------------------------------------------------


class _Transaction:
    """One connection, one message, phase by phase; `phase` names where a failure happened."""

    def __init__(self, envelope: Envelope, *, host: str, port: int, timeout: float,
                 security: Security | None = None) -> None:
        self.envelope = envelope
        self.host = host
        self.port = port
        self.security = security or Security()
        self.deadline = time.monotonic() + timeout
        self.phase = "connect"
        local_hostname = envelope.sender.rpartition("@")[2] or "localhost"
        # A fixed EHLO name: the default would resolve this host's FQDN on every call. No host
        # yet: connecting is the first phase of run().
        self.smtp: smtplib.SMTP
        if self.security.tls == "implicit":
            self.smtp = smtplib.SMTP_SSL(local_hostname=local_hostname,
                                         context=ssl.create_default_context())
        else:
            self.smtp = smtplib.SMTP(local_hostname=local_hostname)

    def run(self) -> SendOutcome:
        try:
            try:
                refusal = self._offer()
            except (OSError, smtplib.SMTPException) as exc:
                # The terminating dot has not left: the server cannot have the message.
                return NotSent(error_class=f"smtp.{self.phase}.{failure_name(exc)}")
            if refusal is not None:
                self._quit()
                return refusal
            return self._outcome()
        finally:
            self.smtp.close()

    def _remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _arm(self, phase: str) -> None:
        self.phase = phase
        remaining = self._remaining()
        if remaining <= 0:
            raise TimeoutError(phase)
        if self.smtp.sock is not None:
            self.smtp.sock.settimeout(remaining)

    def _offer(self) -> SendOutcome | None:
        """Everything up to writing the payload with its dot; a refusal, or None once it left."""
        # Used for the TCP connect and the greeting.
        self.smtp.timeout = max(min(self._remaining(), CONNECT_TIMEOUT_SECONDS), MIN_WAIT_SECONDS)
        code, reply = self.smtp.connect(self.host, self.port)
        if code != 220:
            return classify_refusal("connect", code, reply)
        self._arm("ehlo")
        code, reply = self.smtp.ehlo()
        if code != 250:
            code, reply = self.smtp.helo()
            if code != 250:
                return classify_refusal("ehlo", code, reply)
        if self.security.tls == "starttls":
            self._arm("starttls")
            code, reply = self.smtp.starttls(context=ssl.create_default_context())
            if code != 220:
                return classify_refusal("starttls", code, reply)
            self._arm("ehlo")
            self.smtp.ehlo()
        if self.security.credentials is not None:
            self._arm("auth")
            user, password = self.security.credentials
            # A refused login (535) raises here: nothing was offered, so nothing was sent.
            self.smtp.login(user.value, password.value)
        envelope = self.envelope
        if envelope.smtputf8 and not self.smtp.has_extn("smtputf8"):
            return Rejected(error_class="smtp.ehlo.smtputf8_unsupported")
        self._arm("mail")
        code, reply = self.smtp.mail(envelope.sender, ["SMTPUTF8"] if envelope.smtputf8 else [])
        if code != 250:
            return classify_refusal("mail", code, reply)
        self._arm("rcpt")
        code, reply = self.smtp.rcpt(envelope.recipient)
        if code not in (250, 251):
            return classify_refusal("rcpt", code, reply)
        return self._data()

    def _data(self) -> SendOutcome | None:
        # Not smtplib's data(): it writes the payload and reads the reply in one call, and its
        # exceptions cannot say whether the dot left.
        self._arm("data")
        self.smtp.putcmd("data")
        code, reply = self.smtp.getreply()
        if code != 354:
            return classify_refusal("data", code, reply)
        self._arm("payload")
        assert self.smtp.sock is not None
        self.smtp.sock.sendall(self.envelope.payload)
        return None

    def _outcome(self) -> SendOutcome:
        # From here on the server may hold the message.
        self.phase = "data_end"
        try:
            assert self.smtp.sock is not None
            self.smtp.sock.settimeout(max(self._remaining(), MIN_WAIT_SECONDS))
            code, reply = self.smtp.getreply()
        except (OSError, smtplib.SMTPException) as exc:
            return classify_lost_reply(exc)
        refused = classify_final_reply(code, reply)
        self._quit()
        return refused if refused is not None else self._confirmed(reply)

    def _confirmed(self, reply: bytes) -> Confirmed:
        envelope = self.envelope
        queued = _QUEUE_ID.search(reply)
        queue_id = queued.group(1).decode() if queued else ""
        return Confirmed(
            result={"message_id": envelope.message_id, "queue_id": queue_id,
                    "to": envelope.recipient},
            provider_request_id=queue_id or envelope.message_id,
        )

    def _quit(self) -> None:
        # Courtesy only, once the outcome is known: its failure changes nothing.
        with contextlib.suppress(OSError, smtplib.SMTPException):
            if self.smtp.sock is not None:
                self.smtp.sock.settimeout(QUIT_TIMEOUT_SECONDS)
                self.smtp.quit()


# --- lookups -----------------------------------------------------------------------------------


def message_fields(message: dict[str, Any]) -> dict[str, Any]:
    """What a reconciler verifies against the intent (to, template, subject) and our reference."""
    return {name: message.get(name)
            for name in ("to", "subject", "template", "reference", "message_id")}


def found_messages(messages: list[dict[str, Any]]) -> LookupOutcome:
    if not messages:
        return NotFound()
    # Newest first from the search: the oldest is the original; more than one is an anomaly.
    original = messages[-1]
    status = str(original.get("status", ""))
    return Found(fields=message_fields(original), provider_request_id=str(original.get("id", "")),
                 status=_STATUSES.get(status, status), matches=len(messages), raw=original)


# --- the adapter -------------------------------------------------------------------------------


class SmtpEmailAdapter:
    """Sends over SMTP; looks up by Message-ID through the provider's message-search API
    (without one, an ambiguous send goes to a person: it is never sent again)."""

    def __init__(
        self,
        *,
        name: str,
        host: Callable[[], str],
        port: Callable[[], int],
        sender: Callable[[], str],
        search_url: Callable[[], str] | None,
        capabilities: Capabilities = CAPABILITIES,
        security: Security | None = None,
    ) -> None:
        self.name = name
        self._host = host
        self._port = port
        self._sender = sender
        self._search_url = search_url
        self.security = security or Security()
        self.capabilities = capabilities if search_url is not None else NO_SEARCH_CAPABILITIES

    def __repr__(self) -> str:
        return f"SmtpEmailAdapter({self.name!r})"

    def send(self, operation: Operation, *, key: str, timeout: float) -> SendOutcome:
        started = time.perf_counter()
        try:
            outcome = self._send(operation, key, timeout)
        finally:
            metrics.PROVIDER_LATENCY.labels(self.name, "send").observe(
                time.perf_counter() - started)
        logger.info(
            "provider send operation_id=%s provider=%s outcome=%s",
            operation.operation_id,
            self.name,
            type(outcome).__name__,
        )
        return outcome

    def _send(self, operation: Operation, key: str, timeout: float) -> SendOutcome:
        try:
            envelope = build_envelope(operation, key=key, sender=self._sender())
        except InvalidMessage as exc:
            return Rejected(error_class=f"smtp.message.invalid_{exc}")
        return _Transaction(envelope, host=str(self._host()), port=int(self._port()),
                            timeout=timeout, security=self.security).run()

    def lookup_query(self, operation: Operation) -> dict[str, str]:
        if self._search_url is None:
            return {}
        return {"message_id": message_id_for(operation.idempotency_key)}

    def lookup(self, operation: Operation, *, timeout: float) -> LookupOutcome:
        if self._search_url is None:
            return Unavailable(error_class="lookup_not_supported")
        started = time.perf_counter()
        try:
            response = httpx.get(
                f"{str(self._search_url()).rstrip('/')}/v1/messages",
                params={"message_id": message_id_for(operation.idempotency_key)},
                timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_SECONDS)),
            )
        except httpx.HTTPError as exc:
            return Unavailable(error_class=f"transport.{type(exc).__name__}")
        finally:
            metrics.PROVIDER_LATENCY.labels(self.name, "lookup").observe(
                time.perf_counter() - started)
        if response.status_code != 200:
            return Unavailable(error_class=f"http_{response.status_code}")
        try:
            data = response.json().get("data")
        except (ValueError, AttributeError):
            data = None
        if not isinstance(data, list):
            return Unavailable(error_class="smtp_search.malformed")
        return found_messages([message for message in data if isinstance(message, dict)])


# --- from the catalogue ------------------------------------------------------------------------

def build_smtp(reader: SettingsReader, context: ConnectorContext, *, name: str
               ) -> SmtpEmailAdapter:
    """`connector = "smtp"`: host, port, tls (none, starttls, implicit), username / password
    (env:NAME only), sender, and an optional search_url (a delivery-log search by Message-ID)."""
    host = reader.address("host")
    port = reader.address("port", 587)
    tls = reader.string("tls", "starttls")
    if tls not in TLS_MODES:
        raise ConnectorConfigError(reader.key("tls"), f"must be one of {', '.join(TLS_MODES)}")
    username = reader.secret("username", required=False)
    password = reader.secret("password", required=False)
    if (username is None) != (password is None):
        raise ConnectorConfigError(reader.key("password" if password is None else "username"),
                                   "username and password go together")
    sender = reader.address("sender")
    search_url = reader.address("search_url") if reader.has("search_url") else None
    if search_url is None:
        reader.raw("search_url")
    missing = [part for part in ("to", "subject", "template")
               if part not in context.intent_fields]
    if missing:
        # The message is built from these intent fields, and a lookup verifies them.
        raise ConnectorConfigError(reader.key("connector"),
                                   f"smtp needs the intent fields {', '.join(missing)}")
    consistency = reader.number("lookup_consistency_seconds",
                                CAPABILITIES.lookup_consistency_seconds)
    reader.finish()
    credentials = (username, password) if username is not None and password is not None \
        else None
    return SmtpEmailAdapter(
        name=name, host=host, port=port, sender=sender, search_url=search_url,
        capabilities=Capabilities(**{**CAPABILITIES.__dict__,
                                     "lookup_consistency_seconds": consistency}),
        security=Security(tls=tls, credentials=credentials))
