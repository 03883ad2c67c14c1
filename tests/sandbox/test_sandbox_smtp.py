"""The sandbox's e-mail provider: its SMTP listener and its message-search API, spoken to over
real sockets."""

from __future__ import annotations

import select
import smtplib
import socket
from collections.abc import Iterator
from email import policy
from email.message import EmailMessage
from typing import Any

import httpx
import pytest

from sandbox.smtp import MAX_MESSAGE_BYTES
from sandbox.testing import SandboxClient, SandboxServer

MESSAGE_ID = "<al_0123456789@agent-ledger.invalid>"


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[SandboxServer]:
    with SandboxServer(smtp=True) as server:
        yield server


class Session:
    """A hand-driven SMTP client: every command and reply is visible to the test."""

    def __init__(self, port: int, *, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")
        self.greeting = self.read()

    def read(self) -> tuple[int, str]:
        lines = []
        while True:
            line = self.file.readline()
            if not line:
                raise ConnectionError("closed by the server")
            lines.append(line[4:].decode().rstrip("\r\n"))
            if line[3:4] != b"-":
                return int(line[:3]), "\n".join(lines)

    def command(self, line: str) -> tuple[int, str]:
        self.sock.sendall(line.encode() + b"\r\n")
        return self.read()

    def answer_within(self, seconds: float) -> bool:
        readable, _, _ = select.select([self.sock], [], [], seconds)
        return bool(readable)

    def closed_by_server(self) -> bool:
        return self.file.read() == b""

    def start(self, recipient: str = "cus@example.com") -> None:
        assert self.command("EHLO client.invalid")[0] == 250
        assert self.command("MAIL FROM:<ledger@example.invalid>")[0] == 250
        assert self.command(f"RCPT TO:<{recipient}>")[0] == 250
        assert self.command("DATA")[0] == 354

    def finish(self, message: bytes) -> None:
        """The message, dot-stuffed, and the terminating dot; the reply is left to read."""
        stuffed = message.replace(b"\r\n.", b"\r\n..")
        self.sock.sendall(stuffed + b".\r\n")

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture
def session(sandbox_server: SandboxServer, sandbox: SandboxClient) -> Iterator[Session]:
    assert sandbox_server.smtp_port is not None
    smtp = Session(sandbox_server.smtp_port)
    yield smtp
    smtp.close()


@pytest.fixture
def smtp(sandbox_server: SandboxServer, sandbox: SandboxClient) -> Iterator[smtplib.SMTP]:
    assert sandbox_server.smtp_port is not None
    client = smtplib.SMTP("127.0.0.1", sandbox_server.smtp_port, timeout=5)
    yield client
    client.close()


def message(
    subject: str = "Your refund is on its way",
    body: str = "Hello,\nyour refund was sent.\n",
    *,
    reference: str = "op-1",
    to: str = "cus@example.com",
) -> bytes:
    email = EmailMessage(policy=policy.SMTP)
    email["From"] = "ledger@example.invalid"
    email["To"] = to
    email["Subject"] = subject
    email["Message-ID"] = MESSAGE_ID
    email["X-Operation-Id"] = reference
    email["X-Template"] = "refund_sent"
    email.set_content(body)
    return email.as_bytes()


def search(http: httpx.Client, **query: str) -> httpx.Response:
    return http.get("/v1/messages", params=query)


# --- delivery ------------------------------------------------------------------------------------


def test_a_delivered_message_is_an_effect_counted_under_its_operation(
    session: Session, sandbox: SandboxClient
) -> None:
    session.start()
    session.finish(message())

    code, text = session.read()

    assert code == 250
    [delivered] = sandbox.effects()
    assert text == f"2.0.0 OK queued as {delivered['id']}"
    assert delivered == {
        "id": delivered["id"],
        "object": "message",
        "message_id": MESSAGE_ID,
        "reference": "op-1",
        "to": "cus@example.com",
        "subject": "Your refund is on its way",
        "template": "refund_sent",
        "size": len(message()),
        "status": "delivered",
        "created": delivered["created"],
    }
    assert sandbox.effect_counts() == {"op-1": 1}
    assert sandbox.messages(message_id=MESSAGE_ID) == [delivered]
    assert sandbox.messages(reference="op-1") == [delivered]
    assert session.command("QUIT")[0] == 221 and session.closed_by_server()


def test_greeting_and_ehlo_advertise_what_the_listener_supports(session: Session) -> None:
    assert session.greeting[0] == 220

    code, text = session.command("EHLO client.invalid")

    assert code == 250
    assert text.splitlines()[1:] == ["8BITMIME", "SMTPUTF8", f"SIZE {MAX_MESSAGE_BYTES}"]


def test_dot_stuffing_is_undone_and_only_a_lone_dot_ends_the_data(
    session: Session, sandbox: SandboxClient
) -> None:
    original = message(body=".starts with a dot\n.\n..\nlast line\n")
    session.start()
    session.finish(original)

    assert session.read()[0] == 250
    [delivered] = sandbox.effects()
    assert delivered["size"] == len(original)
    # The session is still in step: the body's dots were not taken for commands.
    assert session.command("NOOP") == (250, "2.0.0 OK")


def test_the_same_message_sent_again_is_delivered_again(
    smtp: smtplib.SMTP, sandbox: SandboxClient
) -> None:
    for _ in range(2):
        smtp.sendmail("ledger@example.invalid", ["cus@example.com"], message())

    assert sandbox.effect_counts() == {"op-1": 2}
    # A real SMTP server keeps no idempotency record: only the sender can avoid a duplicate.
    assert len(sandbox.messages(message_id=MESSAGE_ID)) == 2


def test_an_smtputf8_address_is_accepted(smtp: smtplib.SMTP, sandbox: SandboxClient) -> None:
    email = EmailMessage(policy=policy.SMTPUTF8)
    email["From"] = "ledger@example.invalid"
    email["To"] = "jürgen@exämple.de"
    email["Subject"] = "Grüße"
    email["X-Operation-Id"] = "op-1"
    email.set_content("Hallo")

    smtp.send_message(email)

    [delivered] = sandbox.effects()
    assert (delivered["to"], delivered["subject"]) == ("jürgen@exämple.de", "Grüße")


# --- the protocol --------------------------------------------------------------------------------


def test_commands_out_of_sequence_are_refused(session: Session) -> None:
    assert session.command("MAIL FROM:<a@example.com>")[0] == 503
    assert session.command("EHLO")[0] == 501
    assert session.command("HELO client.invalid")[0] == 250
    assert session.command("RCPT TO:<b@example.com>")[0] == 503
    assert session.command("DATA")[0] == 503
    assert session.command("MAIL FROM:<a@example.com>")[0] == 250
    assert session.command("MAIL FROM:<a@example.com>")[0] == 503
    assert session.command("DATA")[0] == 503
    assert session.command("RCPT TO:b@example.com")[0] == 501
    assert session.command("RCPT TO:<nobody>")[0] == 501
    assert session.command("RCPT TO:<b@example.com>")[0] == 250
    assert session.command("DATA now")[0] == 501


def test_rset_abandons_the_transaction(session: Session) -> None:
    session.command("EHLO client.invalid")
    session.command("MAIL FROM:<a@example.com>")
    session.command("RCPT TO:<b@example.com>")

    assert session.command("RSET") == (250, "2.0.0 OK")

    assert session.command("DATA")[0] == 503
    assert session.command("MAIL FROM:<a@example.com>")[0] == 250


def test_other_commands(session: Session) -> None:
    assert session.command("NOOP")[0] == 250
    assert session.command("VRFY someone")[0] == 252
    assert session.command("HELP")[0] == 502
    assert session.command("EXPN list")[0] == 502
    assert session.command("STARTTLS")[0] == 500
    assert session.command("x" * 600)[0] == 500
    assert session.command("noop")[0] == 250  # verbs are case-insensitive
    assert session.command("QUIT")[0] == 221
    assert session.closed_by_server()


def test_mail_parameters_need_ehlo_and_are_checked(session: Session) -> None:
    session.command("HELO client.invalid")
    assert session.command("MAIL FROM:<a@example.com> SIZE=10")[0] == 555
    session.command("EHLO client.invalid")
    assert session.command("MAIL FROM:<a@example.com> AUTH=<>")[0] == 555
    assert session.command(f"MAIL FROM:<a@example.com> SIZE={MAX_MESSAGE_BYTES + 1}")[0] == 552
    assert session.command("MAIL FROM:<a@example.com> SIZE=10 BODY=8BITMIME SMTPUTF8")[0] == 250


def test_a_message_over_the_size_limit_is_refused_and_not_stored(
    session: Session, sandbox: SandboxClient
) -> None:
    session.start()
    line = b"x" * 998 + b"\r\n"
    session.finish(message() + line * (MAX_MESSAGE_BYTES // len(line) + 1))

    assert session.read()[0] == 552
    assert sandbox.effects() == []
    assert session.command("NOOP")[0] == 250


def test_a_client_that_hangs_up_before_the_dot_sent_no_message(
    session: Session, sandbox: SandboxClient
) -> None:
    session.start()
    session.sock.sendall(message())
    session.sock.shutdown(socket.SHUT_WR)

    # The server closes its side once it has seen the end of the stream, and only then.
    assert session.closed_by_server()
    assert sandbox.effects() == []
    assert sandbox.request_counts()["total"] == 0


# --- faults --------------------------------------------------------------------------------------


def test_a_magic_recipient_is_rejected_at_rcpt_and_nothing_is_stored(
    session: Session, sandbox: SandboxClient
) -> None:
    session.command("EHLO client.invalid")
    session.command("MAIL FROM:<ledger@example.invalid>")

    assert session.command('RCPT TO:<"sandbox:reject"@example.com>') == (
        550, "5.7.1 rejected by the sandbox")
    assert session.command('RCPT TO:<"sandbox:rate-limit"@example.com>')[0] == 451
    assert session.command("DATA")[0] == 503  # no recipient was accepted
    assert sandbox.effects() == []
    assert sandbox.request_counts()["by_fault"] == {"rate-limit": 1, "reject": 1}


@pytest.mark.parametrize(
    ("fault", "code", "stored"),
    [
        ("reject", "550 5.7.1 rejected by the sandbox", 0),
        ("rate-limit", "451 4.7.1 rate limited, try again later", 0),
        # A temporary failure for a message that *was* delivered: a 4xx after DATA is not proof.
        ("500-after-commit", "451 4.3.0 local error in processing", 1),
    ],
)
def test_faults_answered_at_the_end_of_data(
    session: Session, sandbox: SandboxClient, fault: str, code: str, stored: int
) -> None:
    session.start()
    session.finish(message(subject=f"Re: sandbox:{fault}"))

    assert session.read() == (int(code[:3]), code[4:])
    assert len(sandbox.effects()) == stored
    assert sandbox.request_counts()["by_fault"] == {fault: 1}


def test_lose_response_delivers_then_hangs_up_before_the_250(
    session: Session, sandbox: SandboxClient
) -> None:
    session.start()
    session.finish(message(body="sandbox:lose-response\n"))

    with pytest.raises(ConnectionError):
        session.read()
    assert sandbox.effect_counts() == {"op-1": 1}


def test_drop_before_commit_hangs_up_with_nothing_delivered(
    session: Session, sandbox: SandboxClient
) -> None:
    session.start()
    session.finish(message(body="Please ignore.\nsandbox:drop-before-commit\n"))

    with pytest.raises(ConnectionError):
        session.read()
    assert sandbox.effects() == []


def test_timeout_delivers_then_answers_too_late(session: Session, sandbox: SandboxClient) -> None:
    session.start()
    session.finish(message(body="sandbox:timeout"))

    assert not session.answer_within(0.1)
    assert sandbox.effect_counts() == {"op-1": 1}
    assert session.read()[0] == 250  # after timeout_sleep_seconds (0.5 here)


def test_lookup_lag_hides_a_delivered_message_from_the_search_for_a_while(
    session: Session, sandbox: SandboxClient
) -> None:
    session.start()
    session.finish(message(body="sandbox:lookup-lag-30"))
    assert session.read()[0] == 250

    assert sandbox.messages(message_id=MESSAGE_ID) == []
    assert sandbox.messages(reference="op-1") == []
    assert sandbox.effect_counts() == {"op-1": 1}
    sandbox.advance_clock(31)
    assert len(sandbox.messages(message_id=MESSAGE_ID)) == 1


def test_chaos_applies_to_messages_too(smtp: smtplib.SMTP, sandbox: SandboxClient) -> None:
    sandbox.configure(chaos_probability=1, chaos_faults=["reject"])

    with pytest.raises(smtplib.SMTPDataError) as refused:
        smtp.sendmail("ledger@example.invalid", ["cus@example.com"], message())

    assert refused.value.smtp_code == 550
    assert sandbox.effects() == []


# --- the message-search API and health -----------------------------------------------------------


def test_search_needs_a_message_id_or_a_reference(
    http: httpx.Client, smtp: smtplib.SMTP, sandbox: SandboxClient
) -> None:
    smtp.sendmail("ledger@example.invalid", ["cus@example.com"], message())
    smtp.sendmail("ledger@example.invalid", ["cus@example.com"], message(reference="op-2"))

    assert search(http).status_code == 400
    assert search(http, message_id=MESSAGE_ID, limit="5").status_code == 400
    # The angle brackets are optional; both searches must match when both are given.
    bare = search(http, message_id=MESSAGE_ID.strip("<>")).json()
    assert [m["reference"] for m in bare["data"]] == ["op-2", "op-1"]  # newest first
    both = search(http, message_id=MESSAGE_ID, reference="op-1").json()
    assert both["object"] == "list" and both["has_more"] is False
    assert [m["reference"] for m in both["data"]] == ["op-1"]
    assert search(http, message_id="<other@example.com>").json()["data"] == []


def test_search_sees_only_smtp_deliveries(http: httpx.Client, sandbox: SandboxClient) -> None:
    body: dict[str, Any] = {"reference": "op-1", "params": {"to": "cus@example.com"}}
    assert http.post("/v1/effects/email", json=body).status_code == 201

    assert search(http, reference="op-1").json()["data"] == []


def test_health_reports_the_smtp_port(
    sandbox_server: SandboxServer, sandbox: SandboxClient
) -> None:
    assert sandbox.smtp_port == sandbox_server.smtp_port
    assert f"sandbox smtp listening on 127.0.0.1:{sandbox.smtp_port}" in sandbox_server.log()
