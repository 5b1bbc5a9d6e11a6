"""The result record an evaluation returns to the bot (plain data, JSON-serialisable).

The GPU side never talks to GitHub or the database: it returns one `EvalResult`, and the bot's
`publish` queue turns it into a comment, a check run, labels and rows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Verdict(str, Enum):
    XL = "XL"
    L = "L"
    M = "M"
    S = "S"
    NONE = "none"
    REJECT = "REJECT"
    INFRA = "INFRA"  # not a measurement of the PR: retried, never REJECT, never merged
    BUILD_FAILED = "BUILD_FAILED"  # the head revision does not build/import/load: the PR's fault
    # Never merged, never a pass (issue 13):
    MIXED = "mixed"  # a significant regression on one gate beside a significant speedup on another
    UNCALIBRATED = "uncalibrated"  # a gate's A/A history cannot back a bound: no tier, no pass
    WITHHELD = "withheld"  # a tier was measured but an earlier attempt failed: no tier until a clean evaluation


TIER_ORDER = [Verdict.XL, Verdict.L, Verdict.M, Verdict.S, Verdict.NONE]
TIERS = frozenset({Verdict.XL, Verdict.L, Verdict.M, Verdict.S})  # the only verdicts that may be merged


class InfraKind(str, Enum):
    LOAD_FAILURE = "load_failure"
    OOM = "oom"
    MISSING_METRIC = "missing_metric"
    ZERO_METRIC = "zero_metric"
    NAN_METRIC = "nan_metric"
    TIMEOUT = "timeout"
    BASELINE_CRASHED = "baseline_crashed"
    FOREIGN_GPU_PROCESS = "foreign_gpu_process"
    SANDBOX_FAILURE = "sandbox_failure"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"  # the full sandbox cannot be set up on this host (fail closed)
    CHECKOUT_FAILURE = "checkout_failure"
    INTERNAL_ERROR = "internal_error"
    WORKER_LOST = "worker_lost"  # the worker vanished mid-evaluation (set by the bot's watchdog)
    BASELINE_FAILED_GUARD = "baseline_failed_guard"  # main misses its own accuracy bars (reference/driver/model changed)


@dataclass
class GateResult:
    model: str
    gate: str  # e.g. "decode@4096", "prefill@512"
    metric: str  # "decode_tok_s" | "prefill_tok_s"
    base_median: float | None
    head_median: float | None
    rel_change: float | None  # (head - base) / base; > 0 is faster
    ci_low: float | None
    ci_high: float | None
    noise_floor: float | None
    significant: bool
    regression: bool
    scored: bool = False  # counts towards the improvement tier
    n_pairs: int = 0
    reason: str | None = None  # why a value is null
    # The two one-sided floors (worker/gates/noise.py), as relative changes > 0: a pair counts as slower
    # below -floor_slower, as faster above +floor_faster. noise_floor is the larger of the two.
    floor_slower: float | None = None
    floor_faster: float | None = None
    # > 1: both floors were multiplied by this because the host's recent A/A pairs are noisier than the
    # history the floors came from (worker/calibration/scale.py); 1 = not widened.
    floor_widening: float = 1.0
    # Slower in every pair timed, but short of the pairs its design needs: the confirming pairs timed other gates of
    # the model and one of them confirmed the slowdown (worker/gates/confirm.py). Never significant.
    not_confirmed: bool = False


@dataclass
class GuardResult:
    model: str
    seeds: list[int]
    head_top1: float | None
    base_top1: float | None
    head_kl: float | None
    base_kl: float | None
    top1_floor: float | None
    paired_delta: float | None  # head - base top-1, mean over seeds
    max_drop: float | None  # δ allowed
    kl_bound: float | None
    bit_identical: bool
    passed: bool
    reason: str | None = None


@dataclass
class EvalResult:
    repo: str
    pr_number: int | None
    base_sha: str
    head_sha: str
    profile: str
    verdict: Verdict
    summary: str  # one plain sentence for the comment headline
    gates: list[GateResult] = field(default_factory=list)
    guards: list[GuardResult] = field(default_factory=list)
    infra_kind: InfraKind | None = None
    infra_detail: str | None = None
    build_log_tail: str | None = None
    best_speedup: float | None = None  # the scored gate's relative change behind the tier
    receipt: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    duration_s: float | None = None
    # A head fault judged the PR's own (worker/verdicts/attribution.py): {"role", "model", "phase", "kind", "detail", "attempts"}
    failure: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # what limits the verdict (uncalibrated gates, drift, earlier attempts)
    # Made under the development override with an incomplete sandbox: never merged (bot/rounds.py).
    sandbox_override: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        d["infra_kind"] = self.infra_kind.value if self.infra_kind else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        d = dict(d)
        d["verdict"] = Verdict(d["verdict"])
        d["infra_kind"] = InfraKind(d["infra_kind"]) if d.get("infra_kind") else None
        d["gates"] = [GateResult(**g) for g in d.get("gates", [])]
        d["guards"] = [GuardResult(**g) for g in d.get("guards", [])]
        return cls(**d)
