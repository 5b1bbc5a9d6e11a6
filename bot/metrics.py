"""Prometheus metrics (prometheus-client). Counters live in the process that counts; what the database or
the broker already knows (queue depth, verdicts, INFRA kinds, durations) is read at scrape time, so the web
app's /metrics is right whichever process did the work."""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()  # no auto-describe: the DB collector runs at scrape only

DELIVERIES = Counter("tokengate_deliveries_total", "Webhook deliveries answered, by event and outcome",
                     ["event", "outcome"], registry=REGISTRY)
HANDLED = Counter("tokengate_deliveries_handled_total", "Deliveries handled on the publish side, by event and "
                  "outcome (processed | retry | failed)", ["event", "outcome"], registry=REGISTRY)
GITHUB_ERRORS = Counter("tokengate_github_api_errors_total", "GitHub API errors seen by the publish side, by kind "
                        "(HTTP status, 'rate_limit' or 'transport')", ["kind"], registry=REGISTRY)
GITHUB_RATE_REMAINING = Gauge("tokengate_github_rate_limit_remaining", "Requests left in GitHub's rate limit "
                              "window (last response seen)", registry=REGISTRY)
RESULTS_REJECTED = Counter("tokengate_results_rejected_total", "Results refused (not dispatched, not waited for, or "
                           "not signed with the worker's key), by reason", ["reason"], registry=REGISTRY)

CLAIMS_REJECTED = Counter("tokengate_claims_rejected_total", "Start claims refused (not signed with a known "
                          "worker's key, or the attempt is bound to another worker), by reason", ["reason"],
                          registry=REGISTRY)

DURATION_BUCKETS = (60, 300, 600, 1200, 1800, 3600, 7200, 14400, float("inf"))


class DatabaseCollector:
    """Queue depth, verdicts, INFRA kinds and evaluation durations, from the database and the broker."""

    def collect(self):
        from sqlalchemy import func, select

        from bot.db.engine import session_scope
        from bot.db.models import Delivery, Evaluation
        depth = GaugeMetricFamily("tokengate_queue_depth", "Evaluations waiting or running, by state",
                                  labels=["state"])
        verdicts = CounterMetricFamily("tokengate_verdicts", "Finished evaluations by verdict", labels=["verdict"])
        infra = CounterMetricFamily("tokengate_infra", "INFRA results by kind", labels=["kind"])
        pending = GaugeMetricFamily("tokengate_deliveries_pending", "Deliveries stored but not processed yet "
                                    "(failed = retries exhausted)", labels=["status"])
        hist = HistogramMetricFamily("tokengate_evaluation_duration_seconds", "Evaluation durations")
        try:
            with session_scope() as s:
                for state, n in s.execute(select(Evaluation.state, func.count()).group_by(Evaluation.state)):
                    if state.active:
                        depth.add_metric([state.value], n)
                for verdict, n in s.execute(select(Evaluation.verdict, func.count())
                                            .where(Evaluation.verdict.is_not(None)).group_by(Evaluation.verdict)):
                    verdicts.add_metric([verdict], n)
                for kind, n in s.execute(select(Evaluation.infra_kind, func.count())
                                         .where(Evaluation.infra_kind.is_not(None)).group_by(Evaluation.infra_kind)):
                    infra.add_metric([kind], n)
                waiting = s.scalar(select(func.count()).where(Delivery.processed_at.is_(None),
                                                              Delivery.failed_at.is_(None))) or 0
                failed = s.scalar(select(func.count()).where(Delivery.failed_at.is_not(None))) or 0
                pending.add_metric(["waiting"], waiting)
                pending.add_metric(["failed"], failed)
                durations = list(s.scalars(select(Evaluation.duration_s).where(Evaluation.duration_s.is_not(None))))
        except Exception:  # noqa: BLE001 - a scrape during a database outage shows the counters, not a 500
            log.warning("metrics: database unavailable", exc_info=True)
            return
        buckets, total = [], 0
        for le in DURATION_BUCKETS:
            total = sum(d <= le for d in durations)
            buckets.append(("+Inf" if le == float("inf") else str(le), total))
        hist.add_metric([], buckets, sum(durations))
        yield from (depth, verdicts, infra, pending, hist)


REGISTRY.register(DatabaseCollector())


def render() -> bytes:
    return generate_latest(REGISTRY)


def record_github_error(exc: BaseException) -> None:
    from github import GithubException, RateLimitExceededException
    if isinstance(exc, RateLimitExceededException):
        GITHUB_ERRORS.labels("rate_limit").inc()
    elif isinstance(exc, GithubException):
        GITHUB_ERRORS.labels(str(exc.status)).inc()
    else:
        GITHUB_ERRORS.labels("transport").inc()
