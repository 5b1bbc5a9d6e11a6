"""Accuracy guards: top-1 agreement and KL of base and head against the pinned fp32 reference.

The reference logits come from the deployed service's own runtime (backend="reference"), never
from a revision, and are cached by model sha256 + seed + prompt shape + reference version.

Head is judged *paired against base on the same prompts*: its top-1 may not drop by more than δ,
and its KL may not exceed `ratio x base KL + tol` (a PR that keeps every argmax but multiplies the
KL several-fold fails), beside absolute bars. The bounds come from A/A seed scores keyed by model
sha256 + reference version (`guard_key`). Main missing its own bars means the reference, driver
or model changed: INFRA with that reason, never a REJECT of the PR. A head whose logits are bit
for bit base's cannot fail.

Prompts look like text (`text_like_ids`): token ids drawn from a Zipf law over the synthetic
vocabulary's normal tokens with repeated spans, not uniform ids, plus one long prompt per model
(`ProfileSettings.long_context`).
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worker.guards import arith
from worker.config import EvalSettings, ProfileSettings
from worker.verdicts.faults import infra
from worker.harness.client import RevisionFault, RevisionProcess
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


def guard_key(model_sha: str, ref_version: str) -> str:
    """Guard A/A history is comparable only for the same model file and the same reference."""
    return f"{model_sha[:32]}:{ref_version}"


# Logits of one prompt are [n, vocab] float32: a long prompt of a real-vocabulary model is GBs
# (4096 x 248k = 4 GB; 32k: 32 GB). Above this many bytes the long prompt's logits stay in the
# revision's process and only rows the parent picks after the prefill come back (`long_positions`).
LONG_LOGITS_MAX_BYTES = 1 << 30


def long_positions(n: int, vocab: int, budget: int | None = None) -> list[int] | None:
    """Positions of a long prompt to score: None = all (they fit the budget); else as many as fit,
    drawn in secret from the deep half [n/2, n) (the last always among them): the parent sends them
    only after the revision's prefill answered, so it cannot tell before which rows are scored."""
    budget = LONG_LOGITS_MAX_BYTES if budget is None else budget
    if n * vocab * 4 <= budget:
        return None
    lo = n // 2
    k = max(1, min(n - lo, budget // (vocab * 4)))
    if k >= n - lo:
        return list(range(lo, n))
    import secrets as _secrets

    picked = _secrets.SystemRandom().sample(range(lo, n - 1), k - 1)
    return sorted(picked) + [n - 1]


def text_like_ids(vocab: int, n: int, *parts) -> list[int]:
    """A deterministic prompt with text's token statistics: Zipf-distributed ids over the synthetic
    vocabulary's normal tokens (no specials or padding), a seeded rank→id map, and ~15 % of the
    tokens in spans copied from earlier in the prompt (text repeats itself; long contexts need it)."""
    from runtime.synth.report import n_normal_tokens

    h = hashlib.sha256(repr(("text", *parts)).encode()).digest()
    rng = np.random.default_rng(int.from_bytes(h[:8], "little"))
    normal = n_normal_tokens(vocab) if vocab > 64 else vocab
    rank_to_id = rng.permutation(normal)
    ranks = np.minimum(rng.zipf(1.2, size=n) - 1, normal - 1)
    ids = rank_to_id[ranks]
    i = 16
    while i < n:
        if rng.random() < 0.15 / 8:  # a span of ~8 tokens copied from earlier
            L = int(min(n - i, rng.integers(4, 13)))
            src = int(rng.integers(0, max(1, i - L)))
            ids[i:i + L] = ids[src:src + L]
            i += L
        else:
            i += 1
    return [int(x) for x in ids]


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
    # Roles scored before this one on the same prompts -> whether every logit of every prompt had the same
    # bits (compared exactly, prompt by prompt, never through a digest: a head bit-identical to base cannot fail).
    identical_to: dict = field(default_factory=dict)
    long_context: int | None = None  # length of the long prompt (None: none in this profile)
    long_scored: int = 0  # its positions whose KL was scored (all, or rows drawn after the prefill)
    note: str | None = None
    # Parent-clock seconds of the scoring: the reference's logits (shared by both revisions, 0 when
    # cached), this revision's prefill + logits transfer, and the parent's comparison.
    seconds: dict = field(default_factory=lambda: {"reference": 0.0, "logits": 0.0, "compare": 0.0})

    @property
    def top1(self) -> float:
        return float(np.mean([s.top1 for s in self.seeds]))

    @property
    def kl(self) -> float:
        return float(np.mean([s.kl_mean for s in self.seeds]))


def _logits(proc: RevisionProcess, key: str, rows: int, timeout: float,
            positions: list[int] | None = None) -> np.ndarray:
    """All-position logits through the parent's shared memory (worker/harness/shm.py); with
    `positions`, the prefill's logits stay in the revision's process and only those rows come back,
    asked for after the prefill answered."""
    if positions is None:
        resp, _ = proc.request("logits", key=key, phase="accuracy", timeout=timeout)
        return proc.read_logits(resp, rows, "accuracy")
    resp, _ = proc.request("logits", key=key, hold=True, phase="accuracy", timeout=timeout)
    if resp.get("held") != [rows, proc.vocab]:
        raise RevisionFault(proc.role, "accuracy", "protocol", f"held logits of shape {str(resp.get('held'))[:60]}, "
                            f"expected {[rows, proc.vocab]}")
    resp, _ = proc.request("rows", rows=positions, phase="accuracy", timeout=timeout)
    return proc.read_logits(resp, len(positions), "accuracy").reshape(len(positions), -1)


def score_revisions(procs: dict[str, RevisionProcess], reference: RevisionProcess, *, vocab: int,
                    model_sha: str, ref_version: str, profile: ProfileSettings) -> dict[str, RevisionScores]:
    """Per seed, per prompt: compare each revision's logits with the (cached) reference."""
    scores = {r: RevisionScores(r) for r in procs}
    ref_dir = cache_dir() / "reference"
    ref_dir.mkdir(parents=True, exist_ok=True)
    t = profile.request_timeout_s
    long_n = profile.long_context
    prompts_long = [(profile.seeds[0], "long", long_n)] if long_n else []
    long_pos = long_positions(long_n, vocab) if long_n else None
    if not long_n:
        scores_note = "no long prompt in this profile"
    elif long_pos is None:
        scores_note = f"KL at all {long_n} positions of the long prompt"
    else:
        scores_note = (f"KL at {len(long_pos)} positions of the long prompt's {long_n} (from [{long_n // 2}, "
                       f"{long_n}), drawn in secret, asked for after each prefill: {vocab}-token vocabulary)")
    dev = arith.score_device(profile.device)
    for seed in profile.seeds:
        per = {r: [] for r in procs}
        mine = [(seed, p, profile.prompt_len) for p in range(profile.prompts_per_seed)]
        mine += [x for x in prompts_long if x[0] == seed]
        for _, p, n_pos in mine:
            seen: dict[str, np.ndarray] = {}  # this prompt's logits of the roles already scored
            key = f"acc:{seed}:{p}"
            ids = text_like_ids(vocab, n_pos, "accuracy", seed, p)
            pos = long_pos if p == "long" else None
            cache = ref_dir / f"{model_sha[:32]}-t-s{seed}-p{p}-n{n_pos}-{ref_version}.npy"
            t0 = time.monotonic()
            if pos is None and cache.exists():
                ref_lp = np.load(cache)
            else:  # rows drawn for this evaluation are not cached
                reference.request("stage", key=key, ids=ids, phase="accuracy", timeout=t)
                ref_lp = arith.log_softmax(_logits(reference, key, len(ids), t, pos), dev)
                if pos is None:
                    np.save(cache, ref_lp)
            ref = arith.Reference(ref_lp, dev)
            for sc in scores.values():
                sc.seconds["reference"] += time.monotonic() - t0
            for r, proc in procs.items():
                t1 = time.monotonic()
                proc.request("stage", key=key, ids=ids, phase="accuracy", timeout=t)
                lg = _logits(proc, key, len(ids), t, pos)
                t2 = time.monotonic()
                scores[r].seconds["logits"] += t2 - t1
                # A revision's own output: the head's fault when it is the head (worker/verdicts/faults.py).
                on_dev = arith.as_tensor(lg, dev)
                bad = arith.defect(on_dev)
                if bad:
                    what = "not finite" if bad == "nonfinite" else "constant"
                    raise RevisionFault(r, "accuracy", bad, f"logits for seed {seed} prompt {p} are {what}")
                for q, other in seen.items():
                    same = other.shape == lg.shape and np.array_equal(other.view(np.uint32), lg.view(np.uint32))
                    scores[r].identical_to[q] = scores[r].identical_to.get(q, True) and same
                seen[r] = lg
                per[r].append(ref.compare(on_dev))
                del on_dev
                scores[r].seconds["compare"] += time.monotonic() - t2
        for r in procs:
            vals = np.asarray(per[r])
            scores[r].seeds.append(SeedScore(seed, float(vals[:, 0].mean()), float(vals[:, 1].mean()),
                                             float(vals[:, 2].max())))
    ref = on_dev = None  # the last prompt's tensors go before the cache does
    arith.release(dev)  # the reference and the revisions need that GPU memory next (gates, verify)
    for r in procs:
        scores[r].long_context = long_n or None
        scores[r].long_scored = len(long_pos) if long_pos is not None else (long_n or 0)
        scores[r].note = scores_note
    return scores


@dataclass
class GuardBounds:
    top1_floor: float
    max_drop: float
    kl_bound: float  # absolute bar on head KL (and main's own bar)
    calibrated: bool
    note: str
    kl_ratio: float = 1.5  # head KL <= kl_ratio * base KL + kl_tol, on the same prompts
    kl_tol: float = 1e-6


def guard_bounds(aa: list[tuple], n_seeds: int, s: EvalSettings) -> GuardBounds:
    """Bounds from A/A seed scores (seed, base top-1, base KL[, head top-1, head KL]) or stated defaults.

    top-1: the floor sits 4 standard errors (of an n-seed mean) below main's calibrated mean, so main
    does not fail on an unlucky seed draw; δ scales with main's seed-to-seed spread. KL: the absolute
    bar is well above main's calibrated KL; the head/base ratio bar is the configured ratio or, when
    A/A head/base ratios spread wider (GPU non-determinism), exp(|mean| + 4 sd) of their logs.
    """
    ratio, tol = s.kl_ratio_max, s.kl_abs_tol
    if len(aa) < s.min_aa_samples:
        return GuardBounds(s.top1_floor_default, max(s.top1_max_drop_min, 0.02), s.kl_bound_default, False,
                           f"uncalibrated defaults ({len(aa)} A/A seed scores < {s.min_aa_samples}); "
                           f"KL paired against base (ratio {ratio:g})", ratio, tol)
    top1 = np.array([a[1] for a in aa])
    kl = np.array([a[2] for a in aa])
    se_t = float(top1.std(ddof=1)) / math.sqrt(n_seeds)
    se_k = float(kl.std(ddof=1)) / math.sqrt(n_seeds)
    floor = min(float(top1.mean()) - 4 * se_t - 0.005, float(top1.min()))
    drop = max(s.top1_max_drop_min, 3 * se_t)
    kl_bound = max(float(kl.mean()) + 4 * se_k, 1.5 * float(kl.max()), 1e-4)
    logr = [math.log((a[4] + tol) / (a[2] + tol)) for a in aa if len(a) >= 5]
    if len(logr) >= 3:
        ratio = max(ratio, math.exp(abs(float(np.mean(logr))) + 4 * float(np.std(logr, ddof=1))))
    return GuardBounds(floor, drop, kl_bound, True, f"calibrated from {len(aa)} A/A seed scores", ratio, tol)


def check_baseline(model: str, base: RevisionScores, b: GuardBounds) -> None:
    """Main missing its own bars: the reference, driver or model changed under us. INFRA, never REJECT."""
    why = []
    if base.top1 < b.top1_floor:
        why.append(f"main's top-1 {base.top1:.3f} < its floor {b.top1_floor:.3f}")
    if base.kl > b.kl_bound:
        why.append(f"main's KL {base.kl:.3g} > its bar {b.kl_bound:.3g}")
    if why:
        raise infra(InfraKind.BASELINE_FAILED_GUARD,
                    f"{model}: the baseline fails its own accuracy bars ({'; '.join(why)}; {b.note}): the reference, "
                    "driver or model changed; nothing about the PR can be judged until main is recalibrated")


def guard_result(model: str, scores: dict[str, RevisionScores], b: GuardBounds) -> GuardResult:
    head, base = scores["head"], scores["base"]
    check_baseline(model, base, b)
    delta = float(np.mean([h.top1 - o.top1 for h, o in zip(head.seeds, base.seeds)]))
    bit = head.identical_to.get("base", False)
    paired_kl = b.kl_ratio * base.kl + b.kl_tol
    fails = []
    if not bit:  # bit-identical to base (which passed its own bars) cannot fail
        if head.top1 < b.top1_floor:
            fails.append(f"top-1 {head.top1:.3f} < floor {b.top1_floor:.3f}")
        if delta < -b.max_drop:
            fails.append(f"top-1 {delta:+.3f} vs base on the same seeds (δ {b.max_drop:.3f})")
        if head.kl > b.kl_bound:
            fails.append(f"KL {head.kl:.4g} > bound {b.kl_bound:.4g}")
        if head.kl > paired_kl:
            fails.append(f"KL {head.kl:.3g} is {head.kl / base.kl if base.kl > 0 else float('inf'):.3g}x base's "
                         f"{base.kl:.3g} on the same prompts (allowed {b.kl_ratio:.3g}x + {b.kl_tol:.1g})")
    return GuardResult(
        model=model, seeds=[s.seed for s in head.seeds], head_top1=head.top1, base_top1=base.top1,
        head_kl=head.kl, base_kl=base.kl, top1_floor=b.top1_floor, paired_delta=delta, max_drop=b.max_drop,
        kl_bound=min(b.kl_bound, paired_kl), bit_identical=bit, passed=not fails,
        reason="; ".join(fails) if fails else None)
