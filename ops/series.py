"""The "over time" half of the overview: counters read back for one period (one query), and
turned into per-bucket series, quantiles and per-provider tables."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from ops.models import Stat
from ops.rollup import HISTOGRAMS, floor_to

G = Stat.Grain


@dataclass(frozen=True)
class Period:
    key: str
    label: str
    grain: str
    buckets: int
    step: dt.timedelta
    tick_format: str
    bucket_word: str


PERIODS: dict[str, Period] = {
    "hour": Period("hour", "Last hour, by minute", G.MINUTE, 60, dt.timedelta(minutes=1),
                   "%H:%M", "minute"),
    "day": Period("day", "Last day, by hour", G.HOUR, 24, dt.timedelta(hours=1), "%H:00",
                  "hour"),
    "month": Period("month", "Last 30 days, by day", G.DAY, 30, dt.timedelta(days=1), "%d %b",
                    "day"),
}


def quantile(buckets: Mapping[str, float], q: float, bounds: tuple[float, ...]) -> float | None:
    """Prometheus-style histogram_quantile over non-cumulative bucket counts."""
    counts = [float(buckets.get(_label(bound), 0)) for bound in bounds]
    total = sum(counts)
    if total <= 0:
        return None
    target = q * total
    seen = 0.0
    lower = 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count and seen + count >= target:
            if math.isinf(bound):
                return lower  # beyond the last finite bound: report that bound
            return lower + (bound - lower) * (target - seen) / count
        seen += count
        if not math.isinf(bound):
            lower = bound
    return lower


def _label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


@dataclass
class Histogram:
    buckets: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    count: float = 0
    total: float = 0.0

    def add(self, detail: str, count: float, total: float) -> None:
        self.buckets[detail] += count
        self.count += count
        self.total += total

    def q(self, q: float, bounds: tuple[float, ...]) -> float | None:
        return quantile(self.buckets, q, bounds)


@dataclass
class PeriodData:
    period: Period
    starts: list[dt.datetime]
    # metric → detail → per-bucket counts (tools and providers summed)
    counts: dict[str, dict[str, list[float]]]
    # per-bucket histograms of time to resolution (all tools)
    resolution: list[Histogram]
    resolution_all: Histogram
    # provider → per-bucket latency histograms, and the whole period's
    latency: dict[str, list[Histogram]]
    latency_all: dict[str, Histogram]
    # provider → {call result: count} and {error class: count} over the period
    calls: dict[str, dict[str, float]]
    errors: dict[str, dict[str, float]]

    def series(self, metric: str, detail: str | None = None) -> list[float]:
        by_detail = self.counts.get(metric, {})
        if detail is not None:
            return list(by_detail.get(detail, [0.0] * len(self.starts)))
        total = [0.0] * len(self.starts)
        for values in by_detail.values():
            total = [a + b for a, b in zip(total, values, strict=True)]
        return total

    def labels(self) -> list[str]:
        return [start.strftime(self.period.tick_format) for start in self.starts]


def bucket_starts(period: Period, now: dt.datetime) -> list[dt.datetime]:
    last = floor_to(now, period.grain)
    if period.grain == G.DAY:
        return [last - dt.timedelta(days=n) for n in range(period.buckets - 1, -1, -1)]
    return [last - period.step * n for n in range(period.buckets - 1, -1, -1)]


def read_period(period: Period, now: dt.datetime | None = None) -> PeriodData:
    now = now or timezone.now()
    starts = bucket_starts(period, now)
    index = {start: i for i, start in enumerate(starts)}
    rows = Stat.objects.filter(
        grain=period.grain, bucket__gte=starts[0], bucket__lte=starts[-1]
    ).values_list("bucket", "metric", "provider", "detail", "count", "total")
    return _assemble(period, starts, index, rows)


def _assemble(period: Period, starts: list[dt.datetime], index: Mapping[dt.datetime, int],
              rows: Iterable[tuple[dt.datetime, str, str, str, int, float]]) -> PeriodData:
    n = len(starts)
    counts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0] * n))
    resolution = [Histogram() for _ in starts]
    resolution_all = Histogram()
    latency: dict[str, list[Histogram]] = defaultdict(lambda: [Histogram() for _ in starts])
    latency_all: dict[str, Histogram] = defaultdict(Histogram)
    calls: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    errors: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for bucket, metric, provider, detail, count, total in rows:
        i = index.get(bucket.astimezone(dt.UTC))
        if i is None:
            continue
        if metric == "resolution":
            resolution[i].add(detail, count, total)
            resolution_all.add(detail, count, total)
        elif metric == "provider_latency":
            latency[provider][i].add(detail, count, total)
            latency_all[provider].add(detail, count, total)
        elif metric == "provider_call":
            calls[provider][detail] += count
        elif metric == "provider_error":
            errors[provider][detail] += count
        counts[metric][detail][i] += count
    return PeriodData(period, starts, counts, resolution, resolution_all, dict(latency),
                      dict(latency_all), dict(calls), dict(errors))


RESOLUTION_BOUNDS = HISTOGRAMS["resolution"]
LATENCY_BOUNDS = HISTOGRAMS["provider_latency"]


@dataclass
class ProviderHealth:
    provider: str
    calls: int
    failing: int

    @property
    def error_rate(self) -> float:
        return self.failing / self.calls if self.calls else 0.0


def provider_error_rates(now: dt.datetime | None = None,
                         window: dt.timedelta = dt.timedelta(minutes=10)) -> list[ProviderHealth]:
    """Sends answered not_sent or unknown, over all sends, per provider, in the last minutes
    that were rolled up (the banner twin of alerts.yml's LedgerProviderErrorRateHigh)."""
    now = now or timezone.now()
    since = floor_to(now - window, G.MINUTE)
    health: dict[str, ProviderHealth] = {}
    rows = (Stat.objects.filter(grain=G.MINUTE, bucket__gte=since, metric="provider_call")
            .values_list("provider", "detail", "count"))
    for provider, detail, count in rows:
        entry = health.setdefault(provider, ProviderHealth(provider, 0, 0))
        entry.calls += count
        if detail in ("not_sent", "unknown"):
            entry.failing += count
    return sorted(health.values(), key=lambda h: h.provider)


def failing_providers(health: list[ProviderHealth]) -> list[ProviderHealth]:
    threshold = float(settings.OPS_PROVIDER_ERROR_RATE)
    minimum = int(settings.OPS_PROVIDER_ERROR_MIN_CALLS)
    return [h for h in health if h.calls >= minimum and h.error_rate > threshold]


def outcomes_last_day(now: dt.datetime | None = None) -> dict[tuple[str, str], dict[str, int]]:
    """(tool, provider) → {succeeded: n, failed: n} over the last 24 hours (hour counters)."""
    now = now or timezone.now()
    since = floor_to(now, G.HOUR) - dt.timedelta(hours=23)
    result: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = (Stat.objects.filter(grain=G.HOUR, bucket__gte=since, metric__in=["outcome", "fresh"])
            .values_list("tool", "provider", "metric", "detail", "count"))
    for tool, provider, metric, detail, count in rows:
        result[(tool, provider)][detail or metric] += count
    return {key: dict(value) for key, value in result.items()}
