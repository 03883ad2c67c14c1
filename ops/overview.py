"""What the overview page shows: the now-figures with the explorer links behind them, the alert
banners, and the charts of one period. Presentation only; the reads are in ops.figures and
ops.series."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from urllib.parse import urlencode

from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from ops.charts import Chart, Series, seconds_text
from ops.figures import NowFigures, now_figures, sweep_stale_after, webhook_delivery_model
from ops.series import (
    LATENCY_BOUNDS,
    PERIODS,
    RESOLUTION_BOUNDS,
    PeriodData,
    ProviderHealth,
    failing_providers,
    outcomes_last_day,
    provider_error_rates,
    read_period,
)


def explorer_url(**filters: str) -> str:
    query = urlencode({k: v for k, v in filters.items() if v})
    return f"{reverse('ops:operations')}?{query}" if query else reverse("ops:operations")


@dataclass
class Figure:
    label: str
    value: int
    url: str
    alert: bool = False
    help: str = ""


@dataclass
class Banner:
    key: str
    text: str
    url: str
    link_text: str


def figures(now: NowFigures) -> list[Figure]:
    review = reverse("review:queue")
    items = [
        Figure("In flight past their lease", now.in_flight_past_lease,
               explorer_url(problem="past_lease"), now.in_flight_past_lease > 0,
               "A worker claimed them and has not answered in time; the lease sweeper makes "
               "them unknown."),
        Figure("Unknown past their SLA", now.unknown_past_sla, explorer_url(problem="past_sla"),
               now.unknown_past_sla > 0, "Outcome still unproven after the tool's SLA."),
        Figure("Cases awaiting a person", now.awaiting_review, f"{review}?tab=all", False,
               "In the review queue."),
        Figure("Past their review deadline", now.review_overdue, f"{review}?tab=breaching",
               now.review_overdue > 0, "Waiting for a person longer than the review SLA."),
        Figure("Keys near provider retention", now.keys_near_retention,
               explorer_url(problem="near_retention"), now.keys_near_retention > 0,
               "Unresolved, and the provider forgets the idempotency key within 2 hours."),
    ]
    if now.webhooks_failing is not None:
        items.append(Figure("Webhook deliveries failing", now.webhooks_failing,
                            _webhook_admin_url(), now.webhooks_failing > 0,
                            "Retrying after a failed attempt, or given up."))
    return items


def _webhook_admin_url() -> str:
    model = webhook_delivery_model()
    try:
        return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    except (NoReverseMatch, AttributeError):
        return reverse("admin:index")


def banners(now: NowFigures, health: list[ProviderHealth]) -> list[Banner]:
    """The alert rules of deploy/prometheus/alerts.yml, for deployments without Prometheus."""
    out: list[Banner] = []
    if now.in_flight_past_lease:
        out.append(Banner("past_lease", f"{now.in_flight_past_lease} in-flight operation(s) "
                          "past their lease: is the lease sweeper running?",
                          explorer_url(problem="past_lease"), "Show them"))
    if now.unknown_past_sla:
        out.append(Banner("past_sla", f"{now.unknown_past_sla} unknown operation(s) past "
                          "their SLA.", explorer_url(problem="past_sla"), "Show them"))
    if now.review_overdue:
        out.append(Banner("review_overdue", f"{now.review_overdue} case(s) past their review "
                          "deadline.", f"{reverse('review:queue')}?tab=breaching",
                          "Open the review queue"))
    if now.keys_near_retention:
        out.append(Banner("near_retention", f"{now.keys_near_retention} unresolved "
                          "operation(s) whose provider key expires within 2 hours: after that "
                          "a re-send could execute again.",
                          explorer_url(problem="near_retention"), "Show them"))
    stale = now.stale_sweeps
    if stale:
        names = ", ".join(s.name for s in stale)
        minutes = int(sweep_stale_after().total_seconds() // 60)
        out.append(Banner("sweeps", f"Sweeps not running (no finish in {minutes} min): {names}. "
                          "Is a Celery worker with beat (-B) running?", "#sweeps",
                          "Sweep status"))
    for provider in failing_providers(health):
        out.append(Banner(f"provider_{provider.provider}",
                          f"Provider {provider.provider}: {provider.error_rate:.0%} of "
                          f"{provider.calls} sends in the last 10 min not sent or unknown.",
                          explorer_url(provider=provider.provider, status="unknown"),
                          "Show its unknowns"))
    return out


@dataclass
class Overview:
    now: NowFigures
    figures: list[Figure]
    banners: list[Banner]
    last_day: list[dict[str, object]]
    period: str
    data: PeriodData
    charts: list[Chart]
    latency_charts: list[Chart]
    providers: list[dict[str, object]]
    resolution_median: str
    resolution_p95: str
    resolved_count: int


def build(period_key: str, at: dt.datetime | None = None) -> Overview:
    at = at or timezone.now()
    now = now_figures(at)
    health = provider_error_rates(at)
    period = PERIODS.get(period_key, PERIODS["hour"])
    data = read_period(period, at)
    median = data.resolution_all.q(0.5, RESOLUTION_BOUNDS)
    p95 = data.resolution_all.q(0.95, RESOLUTION_BOUNDS)
    return Overview(
        now=now, figures=figures(now), banners=banners(now, health),
        last_day=_last_day(now), period=period.key, data=data, charts=charts(data),
        latency_charts=latency_charts(data), providers=provider_rows(data),
        resolution_median=seconds_text(median) if median is not None else "–",
        resolution_p95=seconds_text(p95) if p95 is not None else "–",
        resolved_count=int(data.resolution_all.count),
    )


def _last_day(now: NowFigures) -> list[dict[str, object]]:
    """Rows of the "by tool and provider" table: open now (exact) and the last 24 h (rolled)."""
    open_by: dict[tuple[str, str], dict[str, int]] = {}
    for row in now.open_rows:
        counts = open_by.setdefault((row.tool, row.provider), {})
        counts[row.status] = counts.get(row.status, 0) + row.count  # summed over versions
    recent = outcomes_last_day(now.now)
    rows = []
    for tool, provider in sorted(set(open_by) | set(recent)):
        live = open_by.get((tool, provider), {})
        done = recent.get((tool, provider), {})
        rows.append({
            "tool": tool, "provider": provider,
            "prepared": live.get("prepared", 0), "in_flight": live.get("in_flight", 0),
            "unknown": live.get("unknown", 0), "fresh": done.get("fresh", 0),
            "succeeded": done.get("succeeded", 0), "failed": done.get("failed", 0),
            "url": explorer_url(tool=tool, provider=provider),
        })
    return rows


def _summary(title: str, data: PeriodData, series: list[Series], unit: str = "") -> str:
    word = data.period.bucket_word
    parts = [f"{s.name}: {s.total:,.0f} in total" for s in series] if unit != "s" else []
    busiest = ""
    if unit != "s":
        totals = [sum(s.values[i] or 0 for s in series) for i in range(len(data.starts))]
        if any(totals):
            i = max(range(len(totals)), key=totals.__getitem__)
            busiest = f" Busiest {word}: {data.labels()[i]} with {totals[i]:,.0f}."
    else:
        known = [(s.name, [v for v in s.values if v is not None]) for s in series]
        parts = [f"{name}: highest {seconds_text(max(values))}" if values else f"{name}: no data"
                 for name, values in known]
    return f"{data.period.label}. {title}. " + "; ".join(parts) + "." + busiest


def _chart(key: str, title: str, kind: str, data: PeriodData, series: list[Series],
           unit: str = "") -> Chart:
    return Chart(key=key, title=title, kind=kind, labels=data.labels(), series=series,
                 unit=unit, summary=_summary(title, data, series, unit),
                 bucket_word=data.period.bucket_word)


def charts(data: PeriodData) -> list[Chart]:
    actions = [Series("Fresh actions", list(data.series("fresh"))),
               Series("Replays", list(data.series("replay"))),
               Series("Params conflicts", list(data.series("conflict")))]
    unknowns = [Series("Proven succeeded", list(data.series("unknown_ended", "proven_succeeded"))),
                Series("Proven failed", list(data.series("unknown_ended", "proven_failed"))),
                Series("Decided by a person", list(data.series("unknown_ended", "person")))]
    opened = [Series("Unknowns opened", list(data.series("unknown_opened")))]
    resolution = [
        Series("Median", [h.q(0.5, RESOLUTION_BOUNDS) for h in data.resolution]),
        Series("95th percentile", [h.q(0.95, RESOLUTION_BOUNDS) for h in data.resolution]),
    ]
    return [
        _chart("chart-actions", "Fresh actions, replays and params conflicts", "stacked", data,
               actions),
        _chart("chart-unknown-opened", "Unknown outcomes opened", "stacked", data, opened),
        _chart("chart-unknown-ended", "How unknown outcomes ended", "stacked", data, unknowns),
        _chart("chart-resolution", "Time from unknown to resolution", "lines", data, resolution,
               unit="s"),
    ]


def latency_charts(data: PeriodData) -> list[Chart]:
    out = []
    for n, (provider, histograms) in enumerate(sorted(data.latency.items())):
        series = [Series("Median", [h.q(0.5, LATENCY_BOUNDS) for h in histograms]),
                  Series("95th percentile", [h.q(0.95, LATENCY_BOUNDS) for h in histograms])]
        out.append(_chart(f"chart-latency-{n}", f"Provider call latency: {provider}", "lines",
                          data, series, unit="s"))
    return out


def provider_rows(data: PeriodData) -> list[dict[str, object]]:
    rows = []
    for provider in sorted(set(data.calls) | set(data.errors) | set(data.latency_all)):
        calls = data.calls.get(provider, {})
        total = sum(calls.values())
        hist = data.latency_all.get(provider)
        median = hist.q(0.5, LATENCY_BOUNDS) if hist else None
        p95 = hist.q(0.95, LATENCY_BOUNDS) if hist else None
        errors = sorted(data.errors.get(provider, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        peak = max((count for _, count in errors), default=0)
        rows.append({
            "provider": provider, "calls": int(total),
            "succeeded": int(calls.get("succeeded", 0)), "failed": int(calls.get("failed", 0)),
            "unknown": int(calls.get("unknown", 0)), "not_sent": int(calls.get("not_sent", 0)),
            "median": seconds_text(median) if median is not None else "–",
            "p95": seconds_text(p95) if p95 is not None else "–",
            "errors": [{"error_class": name, "count": int(count),
                        "share": _bar_width(count, peak)} for name, count in errors[:8]],
            "url": explorer_url(provider=provider),
        })
    return rows


def _bar_width(count: float, peak: float) -> int:
    """A width class (0–10) for the error-class bars: CSS classes, since the CSP forbids
    inline styles."""
    return round(10 * count / peak) if peak else 0
