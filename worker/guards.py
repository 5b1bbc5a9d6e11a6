"""Accuracy guards: top-1 agreement and KL of base and head against the pinned fp32 reference.

The reference logits come from the deployed service's own runtime (backend="reference"), never
from a revision, and are cached by model sha256 + seed + prompt shape + reference version.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worker.gates.bench import prompt_ids
from worker.config import EvalSettings, ProfileSettings
from worker.faults import infra
from worker.harness.client import RevisionProcess
from worker.paths import cache_dir
from worker.records import GuardResult, InfraKind


def reference_version(trusted_root: Path) -> str:
    """Content hash of the deployed runtime's python sources: a new reference = a new cache key."""
    h = hashlib.sha256()
    pkg = trusted_root / "runtime"
    for p in sorted(pkg.rglob("*.py")):
        h.update(str(p.relative_to(pkg)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@dataclass
class SeedScore:
    seed: int
    top1: float
    kl_mean: float
    kl_max: float


@dataclass
class RevisionScores:
    role: str
    seeds: list[SeedScore] = field(default_factory=list)
    logits_digest: "hashlib._Hash" = field(default_factory=hashlib.sha256)

    @property
    def top1(self) -> float:
        return float(np.mean([s.top1 for s in self.seeds]))

    @property
    def kl(self) -> float:
        return float(np.mean([s.kl_mean for s in self.seeds]))


def _logits(proc: RevisionProcess, key: str, rows: int, timeout: float) -> np.ndarray:
    """All-position logits through the parent's shared memory (worker/harness/shm.py)."""
    resp, _ = proc.request("logits", key=key, phase="accuracy", timeout=timeout)
    return proc.read_logits(resp, rows, "accuracy")


def score_revisions(procs: dict[str, RevisionProcess], reference: RevisionProcess, *, vocab: int,
                    model_sha: str, ref_version: str, profile: ProfileSettings) -> dict[str, RevisionScores]:
    """Per seed, per prompt: compare each revision's logits with the (cached) reference."""
    scores = {r: RevisionScores(r) for r in procs}
    ref_dir = cache_dir() / "reference"
    ref_dir.mkdir(parents=True, exist_ok=True)
    t = profile.request_timeout_s
    for seed in profile.seeds:
        per = {r: [] for r in procs}
        for p in range(profile.prompts_per_seed):
            key = f"acc:{seed}:{p}"
            ids = prompt_ids(vocab, profile.prompt_len, "accuracy", seed, p)
            cache = ref_dir / f"{model_sha[:32]}-s{seed}-p{p}-n{profile.prompt_len}-{ref_version}.npy"
            if cache.exists():
                ref_lp = np.load(cache)
            else:
                reference.request("stage", key=key, ids=ids, phase="accuracy", timeout=t)
                ref_lp = _log_softmax(_logits(reference, key, len(ids), t)).astype(np.float32)
                np.save(cache, ref_lp)
            ref_top = ref_lp.argmax(axis=-1)
            ref_p = np.exp(ref_lp.astype(np.float64))
            for r, proc in procs.items():
                proc.request("stage", key=key, ids=ids, phase="accuracy", timeout=t)
                lg = _logits(proc, key, len(ids), t)
                if not np.all(np.isfinite(lg)):
                    raise infra(InfraKind.NAN_METRIC, f"{r}: logits for seed {seed} are not finite; nothing to score")
                if np.all(lg == lg[..., :1]):
                    raise infra(InfraKind.ZERO_METRIC, f"{r}: logits for seed {seed} are constant; nothing to score")
                scores[r].logits_digest.update(lg.tobytes())
                kl = np.maximum((ref_p * (ref_lp.astype(np.float64) - _log_softmax(lg))).sum(axis=-1), 0.0)
                per[r].append((float((lg.argmax(axis=-1) == ref_top).mean()), float(kl.mean()), float(kl.max())))
        for r in procs:
            vals = np.asarray(per[r])
            scores[r].seeds.append(SeedScore(seed, float(vals[:, 0].mean()), float(vals[:, 1].mean()),
                                             float(vals[:, 2].max())))
    return scores


@dataclass
class GuardBounds:
    top1_floor: float
    max_drop: float
    kl_bound: float
    calibrated: bool
    note: str


def guard_bounds(aa_scores: list[tuple[int, float, float]], n_seeds: int, s: EvalSettings) -> GuardBounds:
    """Floors from A/A records of the baseline's per-seed scores (or stated defaults without them).

    The floor sits 4 standard errors (of an n-seed mean) below main's calibrated mean top-1, so
    main itself does not fail on an unlucky seed draw; δ and the KL bound likewise scale with
    main's seed-to-seed spread, with fixed minimums.
    """
    if len(aa_scores) < s.min_aa_samples:
        return GuardBounds(s.top1_floor_default, max(s.top1_max_drop_min, 0.02), s.kl_bound_default, False,
                           f"uncalibrated defaults ({len(aa_scores)} A/A seed scores < {s.min_aa_samples})")
    top1 = np.array([t for _, t, _ in aa_scores])
    kl = np.array([k for _, _, k in aa_scores])
    se_t = float(top1.std(ddof=1)) / math.sqrt(n_seeds)
    se_k = float(kl.std(ddof=1)) / math.sqrt(n_seeds)
    floor = min(float(top1.mean()) - 4 * se_t - 0.005, float(top1.min()))
    drop = max(s.top1_max_drop_min, 3 * se_t)
    kl_bound = max(float(kl.mean()) + 4 * se_k, 1.5 * float(kl.max()), 1e-4)
    return GuardBounds(floor, drop, kl_bound, True, f"calibrated from {len(aa_scores)} A/A seed scores")


def guard_result(model: str, scores: dict[str, RevisionScores], b: GuardBounds) -> GuardResult:
    head, base = scores["head"], scores["base"]
    delta = float(np.mean([h.top1 - o.top1 for h, o in zip(head.seeds, base.seeds)]))
    bit = head.logits_digest.hexdigest() == base.logits_digest.hexdigest()
    fails = []
    if head.top1 < b.top1_floor:
        fails.append(f"top-1 {head.top1:.3f} < floor {b.top1_floor:.3f}")
    if delta < -b.max_drop:
        fails.append(f"top-1 {delta:+.3f} vs base on the same seeds (δ {b.max_drop:.3f})")
    if head.kl > b.kl_bound:
        fails.append(f"KL {head.kl:.4g} > bound {b.kl_bound:.4g}")
    return GuardResult(
        model=model, seeds=[s.seed for s in head.seeds], head_top1=head.top1, base_top1=base.top1,
        head_kl=head.kl, base_kl=base.kl, top1_floor=b.top1_floor, paired_delta=delta, max_drop=b.max_drop,
        kl_bound=b.kl_bound, bit_identical=bit, passed=not fails,
        reason="; ".join(fails) if fails else None)
