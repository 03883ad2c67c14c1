"""Chaos run: many operations through the agents' API, by concurrent clients, against the
sandbox provider with every fault kind switched on; then the sweeps until nothing is left to
reconcile; then the invariants.

    .venv/bin/python bench/chaos.py                      # 5,000 operations (see bench/README.md)
    .venv/bin/python bench/chaos.py --operations 200 --clock shifted
    ACME_PAYOUTS_TOKEN="Bearer chaos" .venv/bin/python bench/chaos.py --operations 300 \
        --clock shifted --tools-file tests/catalogues/acme.toml --tool payout \
        --url-env ACME_PAYOUTS_URL \
        --params '{"supplier": "sup_{n}", "invoice": "inv-{n}", "amount_minor": 4200,
                   "currency": "EUR"}'

With --tools-file and --tool the run drives a tool declared only in a catalogue (its provider
pointed at the sandbox: `setting:SANDBOX_URL`, or an env:NAME that --url-env sets), with the
rate-limit fault added to the mix; --params is its params, "{n}" replaced by the operation's
number.

The test suite runs the same driver at 200 operations (tests/reconciliation/test_chaos.py).
Invariants checked: every operation ends succeeded, failed or awaiting review; the provider's
effects log shows at most one effect per operation ID; no accepted operation is missing;
succeeded ⇔ exactly one effect (with the stored provider reference), failed ⇔ none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.testing import SandboxClient

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ALL_FAULTS = ("lose-response", "timeout", "500-after-commit", "drop-before-commit", "reject",
              "lookup-lag-2")
TOOLS = ("refund", "send_email", "create_ticket")
CATALOGUE_FAULTS = (*ALL_FAULTS, "rate-limit")


@dataclass(frozen=True)
class ChaosConfig:
    operations: int = 5000
    clients: int = 16  # concurrent API clients (threads)
    agents: int = 8  # agent credentials; an operation always comes from the same agent
    sweepers: int = 3  # concurrent case sweepers during convergence
    chaos_probability: float = 0.3
    index_lag_seconds: float = 1.0
    seed: int = 7
    twice_share: float = 0.15  # operations submitted twice under the same ID
    thrice_share: float = 0.10  # … and three times
    high_value_share: float = 0.05  # refunds at or above the high-value threshold
    converge_timeout: float = 600.0  # wall-clock seconds
    tools: tuple[str, ...] = TOOLS
    # Params for tools other than the demo's: strings get "{n}" replaced by the op's number.
    params_template: dict[str, Any] | None = None
    faults: tuple[str, ...] = ALL_FAULTS


@dataclass
class ChaosReport:
    operations: int = 0
    submissions: int = 0
    resubmitted_ids: int = 0
    responses: Counter[int] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    review_reasons: Counter[str] = field(default_factory=Counter)
    faults_injected: dict[str, int] = field(default_factory=dict)
    effects: int = 0
    duplicate_effects: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    submit_seconds: float = 0.0
    converge_seconds: float = 0.0
    simulated_seconds: float = 0.0
    rounds: int = 0

    def lines(self) -> list[str]:
        return [
            f"operations        {self.operations} ({self.submissions} submissions; "
            f"{self.resubmitted_ids} IDs submitted 2-3x)",
            f"API responses     {dict(sorted(self.responses.items()))}",
            f"faults injected   {self.faults_injected}",
            f"final statuses    {dict(sorted(self.statuses.items()))}",
            f"awaiting review   {dict(sorted(self.review_reasons.items()))}",
            f"effects           {self.effects} (duplicates: {len(self.duplicate_effects)})",
            f"missing           {len(self.missing)}",
            f"violations        {len(self.violations)}",
            f"submit phase      {self.submit_seconds:.1f} s",
            f"convergence       {self.converge_seconds:.1f} s wall clock after the last "
            f"submission, {self.rounds} sweep rounds"
            + (f", {self.simulated_seconds:.0f} s simulated" if self.simulated_seconds else ""),
            f"total             {self.submit_seconds + self.converge_seconds:.1f} s",
        ]


# --- clocks ----------------------------------------------------------------------------------

class RealClock:
    """Waits for real."""

    simulated = 0.0

    def advance(self, seconds: float) -> None:
        time.sleep(min(max(seconds, 0.05), 1.0))


class ShiftedClock:
    """Moves Django's clock (time-machine) and the sandbox's own clock together, so backoff,
    consistency windows and index lag pass in no time. The provider's real sleeps (its
    `timeout` fault) still take real time, so each idle round also waits a little for real."""

    def __init__(self, shift: Callable[[float], None], sandbox: SandboxClient) -> None:
        self._shift = shift
        self._sandbox = sandbox
        self.simulated = 0.0

    def advance(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        self._shift(seconds)
        self._sandbox.advance_clock(seconds)
        self.simulated += seconds
        time.sleep(0.1)


# --- the plan ---------------------------------------------------------------------------------

def plan(config: ChaosConfig) -> list[tuple[str, int, dict[str, Any]]]:
    """(operation ID, agent index, API body) per submission, duplicates included, shuffled."""
    rng = random.Random(config.seed)
    submissions = []
    for n in range(config.operations):
        tool = config.tools[n % len(config.tools)]
        operation_id = f"chaos-{config.seed}:obj-{n}:{tool}-1:v1"
        body = {"operation_id": operation_id, "tool": tool, "params": _params(tool, n, rng,
                                                                               config),
                "run_id": f"chaos-run-{n % 50}", "tool_call_id": f"call-{n}"}
        roll = rng.random()
        copies = 3 if roll < config.thrice_share else 2 if roll < config.thrice_share + \
            config.twice_share else 1
        submissions.extend([(operation_id, n % config.agents, body)] * copies)
    rng.shuffle(submissions)
    return submissions


def _params(tool: str, n: int, rng: random.Random, config: ChaosConfig) -> dict[str, Any]:
    if config.params_template is not None:
        return {name: value.replace("{n}", str(n)) if isinstance(value, str) else value
                for name, value in config.params_template.items()}
    if tool == "refund":
        high = rng.random() < config.high_value_share
        return {"invoice": f"invoice-{n}", "amount": rng.randint(100_000, 2_000_000) if high
                else rng.randint(100, 99_999), "currency": "EUR", "payee": f"cus_{n % 97}",
                "memo": "chaos"}
    if tool == "send_email":
        return {"to": f"customer{n}@example.com", "template": "refund_sent",
                "subject": f"About your refund {n}", "body": "Hello"}
    return {"queue": "billing", "customer": f"cus_{n % 97}", "title": f"Check refund {n}"}


# --- phases ---------------------------------------------------------------------------------

def make_agents(count: int, tools: tuple[str, ...] = TOOLS) -> list[str]:
    from ledger.auth import agent_create

    return [agent_create(name=f"chaos-agent-{n}", tools=tools)[1] for n in range(count)]


def submit_all(submissions: list[tuple[str, int, dict[str, Any]]], tokens: list[str],
               clients: int, report: ChaosReport) -> set[str]:
    """Concurrent clients post every submission; like well-behaved agents they re-submit the
    same ID when told "not sent yet" or throttled. Returns the accepted operation IDs."""
    work: queue.Queue[tuple[str, int, dict[str, Any]]] = queue.Queue()
    for item in submissions:
        work.put(item)
    accepted: set[str] = set()
    lock = threading.Lock()

    def client_loop() -> None:
        from django.db import connections
        from rest_framework.test import APIClient

        api: dict[int, APIClient] = {}
        try:
            while True:
                try:
                    operation_id, agent, body = work.get_nowait()
                except queue.Empty:
                    return
                if agent not in api:
                    api[agent] = APIClient()
                    api[agent].credentials(HTTP_AUTHORIZATION=f"Bearer {tokens[agent]}")
                codes = _submit(api[agent], body)
                with lock:
                    report.responses.update(codes)
                    if codes[-1] in (200, 201, 202):
                        accepted.add(operation_id)
        finally:
            connections.close_all()

    _run_threads([client_loop] * clients)
    return accepted


def _submit(api: Any, body: dict[str, Any]) -> list[int]:
    codes = []
    for _ in range(20):
        response = api.post("/api/v1/operations", body, format="json")
        codes.append(response.status_code)
        if response.status_code == 429 or (
            response.status_code == 202 and response.json()["status"] == "prepared"
        ):
            time.sleep(0.2)
            continue
        break
    return codes


def sweep_round(sweepers: int) -> int:
    """Lease sweep, unsent sweep and `sweepers` concurrent case sweeps; returns work done."""
    from ledger import executor
    from reconciliation import services

    done = [0]
    lock = threading.Lock()

    def sweeper(first: bool) -> Callable[[], None]:
        def run() -> None:
            from django.db import connections

            try:
                work = 0
                if first:
                    work += services.sweep_expired_leases() + executor.retry_unsent()
                report = services.sweep_due_cases(budget_seconds=30)
                if report.errors:
                    raise RuntimeError(f"sweep errors: {report.as_dict()}")
                with lock:
                    done[0] += work + report.leased
            finally:
                connections.close_all()

        return run

    _run_threads([sweeper(n == 0) for n in range(sweepers)])
    return done[0]


def converge(clock: RealClock | ShiftedClock, *, sweepers: int, timeout: float,
             report: ChaosReport) -> None:
    started = time.monotonic()
    while True:
        report.rounds += 1
        work = sweep_round(sweepers)
        if converged():
            break
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not converged after {timeout:.0f} s: {pending_summary()}")
        if work == 0:
            clock.advance(seconds_until_next_due())
    report.converge_seconds = time.monotonic() - started
    report.simulated_seconds = clock.simulated


def converged() -> bool:
    from ledger.models import Operation
    from reconciliation.models import Case

    S = Operation.Status
    return not (
        Operation.objects.filter(status__in=[S.PREPARED, S.IN_FLIGHT]).exists()
        or Case.objects.filter(state=Case.State.CHECKING).exists()
    )


def pending_summary() -> dict[str, Any]:
    from django.db.models import Count

    from ledger.models import Operation
    from reconciliation.models import Case

    return {
        "operations": dict(Operation.objects.values_list("status").annotate(Count("id"))),
        "cases": dict(Case.objects.values_list("state").annotate(Count("id"))),
    }


def seconds_until_next_due() -> float:
    from django.db.models import Min
    from django.utils import timezone

    from ledger.models import Operation
    from reconciliation.models import Case

    now = timezone.now()
    candidates = [
        Case.objects.filter(state=Case.State.CHECKING).aggregate(t=Min("next_check_at"))["t"],
        Operation.objects.filter(status=Operation.Status.IN_FLIGHT).aggregate(
            t=Min("lease_expires_at"))["t"],
    ]
    if Operation.objects.filter(status=Operation.Status.PREPARED).exists():
        candidates.append(now + _seconds(10))  # executor.retry_unsent's first backoff
    due = [t for t in candidates if t is not None]
    return max(0.0, (min(due) - now).total_seconds()) if due else 1.0


def _seconds(value: float) -> Any:
    import datetime as dt

    return dt.timedelta(seconds=value)


def verify(accepted: set[str], sandbox: SandboxClient, report: ChaosReport) -> None:
    from ledger.models import Operation
    from reconciliation.models import Case

    S = Operation.Status
    operations = {op.operation_id: op for op in Operation.objects.all()}
    cases = {c.operation_id: c for c in Case.objects.all()}
    effects: dict[str, list[dict[str, Any]]] = {}
    for effect in sandbox.effects():
        effects.setdefault(effect["reference"], []).append(effect)
    report.operations = len(operations)
    report.effects = sum(len(e) for e in effects.values())
    report.duplicate_effects = {ref: len(e) for ref, e in effects.items() if len(e) > 1}
    report.missing = sorted(accepted - set(operations))
    report.statuses = Counter(op.status for op in operations.values())
    report.faults_injected = dict(sandbox.request_counts()["by_fault"])
    for operation_id, operation in operations.items():
        found = effects.get(operation_id, [])
        case = cases.get(operation.pk)
        problem = _check(operation, found, case)
        if problem:
            report.violations.append(f"{operation_id}: {problem}")
        if operation.status == S.UNKNOWN and case is not None:
            report.review_reasons[case.review_reason] += 1
    stray = set(effects) - set(operations)
    report.violations.extend(f"{ref}: effect without an operation" for ref in sorted(stray))
    bad_codes = {code for code in report.responses if code not in (200, 201, 202, 429)}
    report.violations.extend(f"API answered {code}" for code in sorted(bad_codes))


def _check(operation: Any, effects: list[dict[str, Any]], case: Any) -> str | None:
    from ledger.models import Operation
    from reconciliation.models import Case

    S = Operation.Status
    if len(effects) > 1:
        return f"{len(effects)} effects"
    if operation.status == S.SUCCEEDED:
        if len(effects) != 1 or effects[0]["id"] != operation.provider_request_id:
            return f"succeeded with effects {[e['id'] for e in effects]} " \
                   f"vs {operation.provider_request_id!r}"
    elif operation.status == S.FAILED:
        if effects:
            return "failed, yet the provider executed it"
    elif operation.status == S.UNKNOWN:
        if case is None or case.state != Case.State.AWAITING_REVIEW:
            return f"unknown without a case awaiting review ({case and case.state})"
    else:
        return f"left {operation.status}"
    if case is not None and case.state == Case.State.RESOLVED and \
            operation.status not in (S.SUCCEEDED, S.FAILED):
        return "case resolved, operation not"
    return None


def run_chaos(config: ChaosConfig, sandbox: SandboxClient,
              clock: RealClock | ShiftedClock) -> ChaosReport:
    """The whole run, on the database Django is configured with (which must be empty)."""
    report = ChaosReport()
    sandbox.reset()
    sandbox.configure(chaos_probability=config.chaos_probability, chaos_seed=config.seed,
                      chaos_faults=list(config.faults),
                      index_lag_seconds=config.index_lag_seconds)
    tokens = make_agents(config.agents, config.tools)
    submissions = plan(config)
    report.submissions = len(submissions)
    report.resubmitted_ids = sum(1 for n in Counter(s[0] for s in submissions).values() if n > 1)
    started = time.monotonic()
    accepted = submit_all(submissions, tokens, config.clients, report)
    report.submit_seconds = time.monotonic() - started
    converge(clock, sweepers=config.sweepers, timeout=config.converge_timeout, report=report)
    sandbox.configure(chaos_probability=0)
    verify(accepted, sandbox, report)
    return report


def _run_threads(targets: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guard(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guard(t)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


# --- the command line -----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.tools_file:
        os.environ["LEDGER_TOOLS_FILE"] = str(Path(args.tools_file).resolve())
    catalogue_run = bool(args.tool)
    config = ChaosConfig(operations=args.operations, clients=args.clients, agents=args.agents,
                         sweepers=args.sweepers, chaos_probability=args.chaos, seed=args.seed,
                         converge_timeout=args.timeout,
                         tools=tuple(args.tool) if catalogue_run else TOOLS,
                         params_template=json.loads(args.params) if args.params else None,
                         faults=CATALOGUE_FAULTS if catalogue_run else ALL_FAULTS)
    with _environment(args) as sandbox, _clock(args.clock, sandbox) as clock:
        _check_params(config)
        print(f"chaos: {config.operations} operations of {', '.join(config.tools)}, "
              f"{config.clients} clients, "
              f"chaos {config.chaos_probability:.0%} ({', '.join(config.faults)}), "
              f"{args.clock} clock, database {_database_label()}", flush=True)
        report = run_chaos(config, sandbox, clock)
    print("\n".join(report.lines()))
    for violation in report.violations[:20]:
        print(f"  ! {violation}")
    ok = not (report.violations or report.missing or report.duplicate_effects)
    print("OK: every operation succeeded, failed or awaits review; at most one effect each"
          if ok else "FAILED")
    return 0 if ok else 1


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--sweepers", type=int, default=3)
    parser.add_argument("--chaos", type=float, default=0.3, help="fault probability per send")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--clock", choices=["real", "shifted"], default="real",
                        help="real: wait out backoff and consistency windows; shifted: move "
                             "Django's and the sandbox's clocks instead")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="give up converging after this many wall-clock seconds")
    parser.add_argument("--tools-file", help="the catalogue to load (LEDGER_TOOLS_FILE)")
    parser.add_argument("--tool", action="append", default=[],
                        help="drive this catalogue tool (repeatable) instead of the demo's")
    parser.add_argument("--params", help="JSON params for --tool; \"{n}\" is the op number")
    parser.add_argument("--url-env", help="environment variable the catalogue reads the "
                                          "provider's base URL from; set to the sandbox's")
    return parser.parse_args(argv)


def _check_params(config: ChaosConfig) -> None:
    """Refuse before the run what the ledger would refuse for every operation."""
    from ledger.tools import get_tool

    rng = random.Random(0)
    for tool in config.tools:
        errors = get_tool(tool).validate(_params(tool, 0, rng, config))
        if errors:
            raise SystemExit(f"--params do not fit {tool}: {errors}")


@contextlib.contextmanager
def _environment(args: argparse.Namespace) -> Iterator[SandboxClient]:
    """A sandbox process, Django on a fresh throwaway database (SQLite in a temporary folder,
    or a new database next to DATABASE_URL's), torn down afterwards."""
    sys.path.insert(0, str(PROJECT_ROOT))
    from sandbox.testing import SandboxClient, SandboxServer

    scratch = tempfile.mkdtemp(prefix="agent-ledger-chaos-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LEDGER_VAR_DIR", scratch)
    os.environ["LEDGER_TEST_DB_SUFFIX"] = f"chaos_{os.getpid()}"
    os.environ.setdefault("LEDGER_AGENT_RATE", "1000000/min")
    os.environ.setdefault("LEDGER_PROVIDER_TIMEOUT_SECONDS", "1")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    with SandboxServer(env={"SANDBOX_TIMEOUT_SLEEP_SECONDS": "2"}) as server:
        os.environ["SANDBOX_URL"] = server.url
        if args.url_env:
            os.environ[args.url_env] = server.url
        import django

        django.setup()
        from django.db import connection

        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            with SandboxClient(server.url) as client:
                yield client
        finally:
            from django.db import connections

            connections.close_all()
            connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)
            shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _clock(kind: str, sandbox: SandboxClient) -> Iterator[RealClock | ShiftedClock]:
    if kind == "real":
        yield RealClock()
        return
    import time_machine
    from django.utils import timezone

    with time_machine.travel(timezone.now(), tick=True) as traveller:
        yield ShiftedClock(traveller.shift, sandbox)


def _database_label() -> str:
    from django.db import connection

    return f"{connection.vendor} {connection.settings_dict['NAME']}"


if __name__ == "__main__":
    sys.exit(main())
