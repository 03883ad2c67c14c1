"""The dashboard's own small tables: pre-aggregated counters, the rollup's watermark and the
sweeps' heartbeats. None of them is written on the path of an agent's request except the
tally flush (one upsert per process every few seconds)."""

from __future__ import annotations

from django.db import models


class Stat(models.Model):
    """One counter for one time bucket: how many, and the sum of what was measured.

    Each fact is added to its minute, its hour and its day at once, so a chart of the last
    30 days reads 30 rows per series, whatever the number of operations. Histograms (latency,
    time to resolution) are one row per bucket bound, `detail` holding the bound ("0.25",
    "+Inf"), so they add up across rows like Prometheus buckets.
    """

    class Grain(models.TextChoices):
        MINUTE = "minute", "Minute"
        HOUR = "hour", "Hour"
        DAY = "day", "Day"

    grain = models.CharField(max_length=6, choices=Grain.choices)
    bucket = models.DateTimeField()
    metric = models.CharField(max_length=32)
    tool = models.CharField(max_length=64, blank=True, default="")
    provider = models.CharField(max_length=64, blank=True, default="")
    detail = models.CharField(max_length=100, blank=True, default="")
    count = models.BigIntegerField(default=0)
    total = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            # The upsert's conflict target; its (grain, bucket) prefix serves every chart's
            # range read and the pruning of old minutes and hours.
            models.UniqueConstraint(
                fields=["grain", "bucket", "metric", "tool", "provider", "detail"],
                name="ops_stat_key",
            ),
            models.CheckConstraint(condition=models.Q(grain__in=["minute", "hour", "day"]),
                                   name="ops_stat_grain_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.grain} {self.bucket:%Y-%m-%d %H:%M} {self.metric} {self.count}"


class RollupCursor(models.Model):
    """How far the periodic rollup has read the event tables (exclusive)."""

    name = models.CharField(max_length=32, primary_key=True)
    rolled_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} until {self.rolled_until}"


class SweepHeartbeat(models.Model):
    """When each periodic sweep last finished without an error (one row per sweep, updated in
    place by a Celery task_postrun receiver): the "sweeps are not running" alert."""

    sweep = models.CharField(max_length=64, unique=True)
    last_finished_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.sweep} at {self.last_finished_at}"
