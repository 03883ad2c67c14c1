"""The SMTP e-mail adapter against the sandbox's SMTP listener (a real process, no mocks).

SMTP takes no idempotency keys, so what matters is the line between "the server cannot have the
message" (NotSent / Rejected) and "it may have it" (Unknown): a blind re-send would be a second
e-mail."""

from __future__ import annotations

import smtplib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ledger import executor, transitions
from ledger.canonical import params_hash, provider_idempotency_key
from ledger.models import Operation
from ledger.providers.base import (
    Confirmed,
    Found,
    NotFound,
    NotSent,
    Rejected,
    Unavailable,
    Unknown,
    UnknownReason,
)
from ledger.providers.smtp import (
    classify_final_reply,
    classify_lost_reply,
    classify_refusal,
    dot_stuffed,
    message_id_for,
)
from ledger.tools import get_tool
from tests.conftest import STRIPE_SMTP_TOOLS, adapter_named

OP = "wf-81:customer-7:email-1:v1"
S = Operation.Status
TIMEOUT = 1.0


@pytest.fixture
def adapter(stripe_smtp_tools):
    return adapter_named("smtp-sandbox")


@pytest.fixture
def smtp_emails(settings):
    """New e-mails go through the SMTP adapter."""
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS


def email_params(**overrides: Any) -> dict[str, Any]:
    params = {
        "to": "cus@example.com",
        "template": "refund_sent",
        "subject": "Your refund is on its way",
        "body": "Hello,\nyour refund of 25.00 EUR was sent today.\n",
    }
    params.update(overrides)
    return params


def prepared_email(agent, operation_id: str = OP, **overrides: Any) -> Operation:
    tool = get_tool("send_email")
    params = email_params(**overrides)
    intent = tool.intent(params)
    digest = params_hash(tool.name, intent)
    operation, created = transitions.operation_record(agent=agent, values={
        "operation_id": operation_id,
        "tool": tool.name,
        "tool_version": tool.version,
        "provider": "smtp-sandbox",
        "intent_params": intent,
        "params": params,
        "params_hash": digest,
        "idempotency_key": provider_idempotency_key(operation_id=operation_id,
                                                    params_hash=digest),
        "subject": params["to"],
    })
    assert created
    return operation


def send(adapter, operation):
    return adapter.send(operation, key=operation.idempotency_key, timeout=TIMEOUT)


def intent_of(found: Found) -> dict[str, Any]:
    return {name: found.fields[name] for name in ("to", "template", "subject")}


@pytest.fixture
def refused_smtp_port(settings) -> int:
    """An SMTP address where nothing listens: connections are refused, nothing is sent."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.SANDBOX_SMTP_PORT = port
    return port


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never says a word (not even the 220 greeting)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


# --- send ----------------------------------------------------------------------------------------


def test_send_delivers_once_with_the_message_id_derived_from_the_operation(
    agent, sandbox, adapter
):
    operation = prepared_email(agent)

    outcome = send(adapter, operation)

    assert isinstance(outcome, Confirmed) and not outcome.replayed
    message_id = f"<{operation.idempotency_key}@agent-ledger.invalid>"
    [delivered] = sandbox.effects(reference=OP)
    assert outcome.provider_request_id == delivered["id"]
    assert outcome.result == {"message_id": message_id, "queue_id": delivered["id"],
                              "to": "cus@example.com"}
    assert (delivered["message_id"], delivered["to"], delivered["subject"],
            delivered["template"]) == (message_id, "cus@example.com",
                                       "Your refund is on its way", "refund_sent")
    assert sandbox.effect_counts() == {OP: 1}


def test_every_attempt_carries_the_same_message_id_but_smtp_delivers_each(
    agent, sandbox, adapter
):
    operation = prepared_email(agent)

    send(adapter, operation)
    send(adapter, operation)

    # The Message-ID is what a lookup finds, not a deduplication key: hence no blind re-sends.
    assert sandbox.effect_counts() == {OP: 2}
    assert {m["message_id"] for m in sandbox.effects()} == {message_id_for(
        operation.idempotency_key)}
    found = adapter.lookup(operation, timeout=TIMEOUT)
    assert isinstance(found, Found) and found.matches == 2


def test_lost_response_after_the_dot_is_unknown_and_the_message_was_delivered_once(
    agent, sandbox, adapter
):
    operation = prepared_email(agent, body="sandbox:lose-response")

    outcome = send(adapter, operation)

    assert outcome == Unknown(error_class="smtp.data_end.disconnected",
                              reason=UnknownReason.CONNECTION_RESET)
    assert sandbox.effect_counts() == {OP: 1}


def test_timeout_after_the_dot_is_unknown_and_the_message_was_delivered(
    agent, sandbox, adapter
):
    operation = prepared_email(agent, body="sandbox:timeout")

    outcome = send(adapter, operation)

    assert outcome == Unknown(error_class="smtp.data_end.TimeoutError",
                              reason=UnknownReason.TIMEOUT_AFTER_SEND)
    assert sandbox.effect_counts() == {OP: 1}


def test_drop_at_the_end_of_data_is_unknown_although_nothing_was_delivered(
    agent, sandbox, adapter
):
    operation = prepared_email(agent, body="sandbox:drop-before-commit")

    outcome = send(adapter, operation)

    # From the client's side this is indistinguishable from a lost 250.
    assert outcome == Unknown(error_class="smtp.data_end.disconnected",
                              reason=UnknownReason.CONNECTION_RESET)
    assert sandbox.effect_counts() == {}


def test_a_recipient_refused_at_rcpt_is_rejected_with_nothing_stored(agent, sandbox, adapter):
    operation = prepared_email(agent, to='"sandbox:reject"@example.com')

    outcome = send(adapter, operation)

    assert outcome == Rejected(error_class="smtp.rcpt.550.5.7.1",
                               detail={"phase": "rcpt", "code": 550})
    assert sandbox.effects() == []
    assert sandbox.request_counts()["by_fault"] == {"reject": 1}


def test_a_5xx_after_the_dot_is_rejected_with_nothing_stored(agent, sandbox, adapter):
    operation = prepared_email(agent, subject="Re: sandbox:reject")

    outcome = send(adapter, operation)

    assert outcome == Rejected(error_class="smtp.data_end.550.5.7.1",
                               detail={"phase": "data_end", "code": 550})
    assert sandbox.effects() == []


def test_a_4xx_before_data_is_not_sent(agent, sandbox, adapter):
    operation = prepared_email(agent, to='"sandbox:rate-limit"@example.com')

    outcome = send(adapter, operation)

    assert outcome == NotSent(error_class="smtp.rcpt.451.4.7.1")
    assert sandbox.effects() == []


def test_a_4xx_after_the_dot_is_unknown_because_the_message_may_be_delivered(
    agent, sandbox, adapter
):
    operation = prepared_email(agent, body="sandbox:500-after-commit")

    outcome = send(adapter, operation)

    assert outcome == Unknown(error_class="smtp.data_end.451.4.3.0",
                              reason=UnknownReason.AMBIGUOUS_RESPONSE)
    # It was: NotSent here would have let the unsent sweeper deliver a second copy.
    assert sandbox.effect_counts() == {OP: 1}
    found = adapter.lookup(operation, timeout=TIMEOUT)
    assert isinstance(found, Found) and found.status == "succeeded"


def test_refused_connection_is_not_sent(agent, sandbox, adapter, refused_smtp_port):
    operation = prepared_email(agent)

    outcome = send(adapter, operation)

    assert outcome == NotSent(error_class="smtp.connect.ConnectionRefusedError")
    assert sandbox.request_counts()["total"] == 0


def test_a_server_that_never_greets_is_not_sent(agent, adapter, settings, silent_server):
    settings.SANDBOX_SMTP_PORT = silent_server
    operation = prepared_email(agent)

    outcome = adapter.send(operation, key=operation.idempotency_key, timeout=0.2)

    assert outcome == NotSent(error_class="smtp.connect.TimeoutError")


def test_a_subject_that_cannot_be_a_header_is_rejected_before_connecting(
    agent, sandbox, adapter
):
    operation = prepared_email(agent, subject="Hello\nBcc: everyone@example.com")

    outcome = send(adapter, operation)

    assert outcome == Rejected(error_class="smtp.message.invalid_header")
    assert sandbox.request_counts()["total"] == 0


def test_a_non_ascii_recipient_goes_out_with_smtputf8(agent, sandbox, adapter):
    operation = prepared_email(agent, to="jürgen@exämple.de", subject="Grüße")

    outcome = send(adapter, operation)

    assert isinstance(outcome, Confirmed)
    [delivered] = sandbox.effects()
    assert (delivered["to"], delivered["subject"]) == ("jürgen@exämple.de", "Grüße")


# --- classification of what the listener does not produce ---------------------------------------


@pytest.mark.parametrize(
    ("phase", "code", "expected"),
    [
        ("mail", 550, Rejected(error_class="smtp.mail.550.5.7.1",
                               detail={"phase": "mail", "code": 550})),
        ("mail", 421, NotSent(error_class="smtp.mail.421.5.7.1")),
        ("data", 554, Rejected(error_class="smtp.data.554.5.7.1",
                               detail={"phase": "data", "code": 554})),
        # The session was refused, not the message: it may be accepted once the relay is fixed.
        ("connect", 554, NotSent(error_class="smtp.connect.554.5.7.1")),
        ("ehlo", 550, NotSent(error_class="smtp.ehlo.550.5.7.1")),
        ("rcpt", -1, NotSent(error_class="smtp.rcpt.unreadable")),
    ],
)
def test_refusals_before_the_payload(phase, code, expected):
    assert classify_refusal(phase, code, b"5.7.1 go away") == expected


def test_replies_to_the_terminating_dot():
    assert classify_final_reply(250, b"2.0.0 OK queued as ABC") is None
    assert classify_final_reply(554, b"transaction failed") == Rejected(
        error_class="smtp.data_end.554", detail={"phase": "data_end", "code": 554})
    assert classify_final_reply(452, b"4.3.1 insufficient storage") == Unknown(
        error_class="smtp.data_end.452.4.3.1", reason=UnknownReason.AMBIGUOUS_RESPONSE)
    assert classify_final_reply(354, b"") == Unknown(
        error_class="smtp.data_end.354", reason=UnknownReason.AMBIGUOUS_RESPONSE)


def test_a_reply_smtplib_could_not_read_after_the_dot_is_unknown_not_rejected():
    # smtplib raises its own "500 Line too long": no server said 5xx.
    too_long = smtplib.SMTPResponseException(500, "Line too long.")
    assert classify_lost_reply(too_long) == Unknown(
        error_class="smtp.data_end.SMTPResponseException",
        reason=UnknownReason.AMBIGUOUS_RESPONSE)
    # What smtplib's getreply raises when the socket read fails: the OSError is its context.
    reset = smtplib.SMTPServerDisconnected("Connection unexpectedly closed")
    reset.__context__ = ConnectionResetError()
    assert classify_lost_reply(reset) == Unknown(
        error_class="smtp.data_end.ConnectionResetError", reason=UnknownReason.CONNECTION_RESET)
    timed_out = smtplib.SMTPServerDisconnected("Connection unexpectedly closed")
    timed_out.__context__ = TimeoutError()
    assert classify_lost_reply(timed_out).reason is UnknownReason.TIMEOUT_AFTER_SEND


def test_the_payload_is_dot_stuffed_and_terminated():
    assert dot_stuffed(b"a\r\n.b\r\n.\r\n") == b"a\r\n..b\r\n..\r\n.\r\n"
    assert dot_stuffed(b".a") == b"..a\r\n.\r\n"


# --- lookup --------------------------------------------------------------------------------------


def test_lookup_by_message_id_finds_the_message_once_the_index_caught_up(
    agent, sandbox, adapter
):
    operation = prepared_email(agent, body="sandbox:lookup-lag-30")
    sent = send(adapter, operation)
    assert isinstance(sent, Confirmed)

    assert adapter.lookup(operation, timeout=TIMEOUT) == NotFound()
    sandbox.advance_clock(31)
    found = adapter.lookup(operation, timeout=TIMEOUT)

    assert isinstance(found, Found)
    assert found.provider_request_id == sent.provider_request_id
    assert intent_of(found) == operation.intent_params
    assert found.fields["reference"] == OP
    assert found.fields["message_id"] == message_id_for(operation.idempotency_key)
    assert found.status == "succeeded" and found.raw["status"] == "delivered"
    assert found.matches == 1


def test_lookup_of_a_message_never_sent_is_an_authoritative_not_found(agent, sandbox, adapter):
    operation = prepared_email(agent)

    assert adapter.lookup(operation, timeout=TIMEOUT) == NotFound()
    assert adapter.capabilities.authoritative_absence is True
    assert adapter.capabilities.honours_idempotency_keys is False
    assert adapter.capabilities.key_retention_seconds is None
    assert adapter.capabilities.can_lookup


def test_lookup_when_the_search_api_is_unreachable_is_unavailable(
    agent, refused_provider, adapter
):
    operation = prepared_email(agent)

    assert adapter.lookup(operation, timeout=TIMEOUT) == Unavailable(
        error_class="transport.ConnectError")


# --- through the executor ------------------------------------------------------------------------


def test_submit_through_smtp_succeeds_with_one_delivery_and_a_resubmit_is_a_replay(
    agent, sandbox, smtp_emails
):
    submission = executor.submit(agent=agent, operation_id=OP, tool_name="send_email",
                                 params=email_params(), run_id="run-1")

    operation = Operation.objects.get(pk=submission.operation.pk)
    assert submission.disposition is executor.Disposition.CREATED
    assert operation.status == S.SUCCEEDED and operation.provider == "smtp-sandbox"
    assert operation.result["message_id"] == message_id_for(operation.idempotency_key)
    assert sandbox.effect_counts() == {OP: 1}
    # Rewording the body (not an intent field) is still the same operation.
    replay = executor.submit(agent=agent, operation_id=OP, tool_name="send_email",
                             params=email_params(body="Hi again"), run_id="run-1")
    assert replay.disposition is executor.Disposition.REPLAYED
    assert sandbox.effect_counts() == {OP: 1}


def test_a_lost_250_through_the_executor_is_unknown_and_never_sent_again(
    agent, sandbox, smtp_emails
):
    params = email_params(body="sandbox:lose-response")
    first = executor.submit(agent=agent, operation_id=OP, tool_name="send_email", params=params)

    assert first.operation.status == S.UNKNOWN
    assert first.operation.error_class == "smtp.data_end.disconnected"
    again = executor.submit(agent=agent, operation_id=OP, tool_name="send_email", params=params)
    assert again.disposition is executor.Disposition.PENDING
    assert sandbox.effect_counts() == {OP: 1}


def test_refused_then_resubmitted_delivers_once(agent, sandbox, sandbox_server, settings,
                                                smtp_emails, refused_smtp_port):
    first = executor.submit(agent=agent, operation_id=OP, tool_name="send_email",
                            params=email_params())
    assert first.operation.status == S.PREPARED
    assert first.operation.error_class == "smtp.connect.ConnectionRefusedError"

    settings.SANDBOX_SMTP_PORT = sandbox_server.smtp_port
    operation = executor.submit(agent=agent, operation_id=OP, tool_name="send_email",
                                params=email_params()).operation

    assert operation.status == S.SUCCEEDED
    assert sandbox.effect_counts() == {OP: 1}


# --- the provider setting ------------------------------------------------------------------------


def test_email_provider_is_chosen_by_the_catalogue(settings):
    assert get_tool("send_email").provider == "sandbox"
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS
    assert get_tool("send_email").provider == "smtp-sandbox"
    assert get_tool("send_email", version=1).provider == "sandbox"
