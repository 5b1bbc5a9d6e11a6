"""Evaluation settings: gates, thresholds, repetitions, limits (one typed object, no env read here).

The bot's Settings (bot/settings.py) nests this as `settings.eval`; the worker receives it as
plain data with each job, so the GPU side never reads the bot's environment or secrets.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Literal

from pydantic import BaseModel, Field, model_validator

GateMetric = Literal["decode_tok_s", "prefill_tok_s"]


def gate_name(metric: str, context: int) -> str:
    return f"{'decode' if metric == 'decode_tok_s' else 'prefill'}@{context}"


class ModelSpec(BaseModel):
    """One model an evaluation runs. `synth` models are made by the deployed runtime's factory."""

    name: str
    role: Literal["primary", "guard"] = "primary"
    synth: dict | None = None  # {"shape": "tiny", "quant": "q8_0", "seed": 0}
    path: str | None = None  # an existing GGUF instead of a synthetic one
    decode_contexts: list[int] = Field(default_factory=list)
    prefill_contexts: list[int] = Field(default_factory=list)
    scored: list[str] | None = None  # gate names that count for the tier; None = all gates

    @model_validator(mode="after")
    def _one_source(self):
        if (self.synth is None) == (self.path is None):
            raise ValueError(f"model {self.name!r}: give exactly one of synth= or path=")
        return self

    def gate_names(self) -> list[str]:
        return [gate_name("decode_tok_s", c) for c in self.decode_contexts] + [
            gate_name("prefill_tok_s", c) for c in self.prefill_contexts
        ]

    def is_scored(self, gate: str) -> bool:
        return self.role == "primary" and (self.scored is None or gate in self.scored)


# How a timed request is carried out by the trusted driver (what it copies, where, pinned or not): bump it
# when that changes, so that A/A history measured the old way is never read as this way's null.
# 3: a timed prefill unmasks its staged prompt (worker/harness/masking.py), and a timed generate decodes the
# secret lead token it brings before its greedy steps (worker/gates/bench.py; decode tok/s counts n + 1 tokens)
TIMING_PROTOCOL = 3


class ProfileSettings(BaseModel):
    device: str = "cpu"
    backend: str = "auto"  # passed to runtime.load_engine for both revisions
    models: list[ModelSpec]
    decode_tokens: int = Field(16, ge=2)  # greedy steps per decode measurement
    pairs: int = Field(5, ge=2)  # ABBA reps per gate in one process pair
    # Fresh base/head process pairs that must agree before a gate counts as changed (worker/gates/noise.py):
    # the first pair always runs; more run only while some gate stays beyond its floor in every pair.
    max_process_pairs: int = Field(4, ge=1)
    warmup: int = Field(1, ge=0)  # untimed rounds per revision before measuring
    # "wall": parent perf_counter around each request (GPU boxes, dedicated). "oncpu": the on-CPU
    # time of the revision's process tree from /proc/<pid>/task/*/schedstat, read by the parent:
    # immune to other tenants of a shared CPU box (CI); the wall time is kept in the receipt.
    clock: Literal["wall", "oncpu"] = "wall"
    inner: int = Field(3, ge=1)  # timed requests per sample (the fastest counts; all are output-checked)
    # Accuracy guards.
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2])
    prompts_per_seed: int = Field(2, ge=1)
    prompt_len: int = Field(48, ge=4)
    # Output check on the timed decode runs (teacher-forced against the trusted reference).
    output_min_agree: float = 0.9
    output_tie_tol: float = 1e-3  # a token whose reference logit is within this of the max counts
    # Logit-level check of every timed prefill (worker/gates/verify.py): head's KL to the reference
    # may be at most max(floor, ratio x base's KL on the same prompts); base above base_max is INFRA.
    output_kl_floor: float = 1e-3
    output_kl_ratio: float = 4.0
    output_kl_base_max: float = 0.1
    verify_reps: int | None = None  # None = verify every timed rep; k = k reps per gate, drawn in secret
    # Every timed generate also returns each step's logits through shared memory (n x vocab float32
    # copied inside the timed request, the same cost for base and head); the verified reps' are
    # KL-checked at every step. The head may miss the reference's argmax on this many more steps than base.
    decode_step_logits: bool = True
    # On CUDA, page-lock the shared-memory rows those per-step logits land in (worker/harness/driver.py
    # pin_logits): the copy inside every timed generate then goes by DMA instead of through pageable pages.
    pin_step_logits: bool = True
    output_extra_misses: int = Field(2, ge=0)
    # GPU idle check (worker/gates/idle_gpu.py): NVML samples of the frozen revision stamped later than
    # settle_s into the other's timed window count as its kernels running there (NVML's sampling
    # period is up to ~1 s; an earlier sample can be its own previous request). Such a request is
    # timed again up to idle_gpu_retimes times; more than idle_gpu_max_void in one sweep names it.
    idle_gpu_settle_s: float = Field(0.5, ge=0)
    idle_gpu_retimes: int = Field(2, ge=0)
    idle_gpu_max_void: int = Field(3, ge=0)
    # Limits.
    load_timeout_s: float = 300.0
    request_timeout_s: float = 120.0
    eval_timeout_s: float = 1800.0
    # CPU affinity of the revision processes while measured: "last" = one core (the last one this
    # worker may use), shared by base and head so both meet the same contention; "all" = no
    # pinning; or a list. They start and load on all allowed cores (imports overlap) and are pinned
    # to this set before anything is timed.
    cpus: Literal["last", "all"] | list[int] = "last"
    memory_limit_bytes: int | None = 16 << 30  # address-space limit (CPU only; CUDA maps huge VA)
    # --- issue 13 (worker/gates/noise.py, worker/guards/scoring.py) ---
    # Noisy gates get more agreeing process pairs (a finer floor), never a wider floor: gate -> max pairs.
    gate_max_process_pairs: dict[str, int] = Field(default_factory=dict)
    long_context: int | None = None  # one long accuracy prompt per model (KL at this many positions)

    def max_pairs_for(self, gate: str) -> int:
        return max(self.max_process_pairs, self.gate_max_process_pairs.get(gate, 0))

    @model_validator(mode="after")
    def _seeds(self):
        if len(self.seeds) < 3:
            raise ValueError(f"accuracy guards need >= 3 seeds, got {len(self.seeds)}")
        if not any(m.role == "primary" for m in self.models):
            raise ValueError("a profile needs a primary model")
        return self

    def cpu_set(self) -> set[int] | None:
        allowed = sorted(os.sched_getaffinity(0))
        if self.cpus == "all":
            return None
        if self.cpus == "last":
            return {allowed[-1]}
        bad = set(self.cpus) - set(allowed)
        if bad:
            raise ValueError(f"cpus {sorted(bad)} are not available to this worker (allowed: {allowed})")
        return set(self.cpus)

    def protocol_key(self, model: ModelSpec) -> str:
        """Names how a gate's deltas are measured: A/A history is only comparable under one key."""
        fields = self.model_dump(include={"device", "backend", "decode_tokens", "pairs", "warmup", "clock",
                                          "inner", "cpus", "decode_step_logits", "pin_step_logits"})
        blob = json.dumps({**fields, "timing": TIMING_PROTOCOL, "model": model.model_dump(include={"synth", "path"})},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def pin_rows(self) -> int:
        """Rows of per-step logits the driver page-locks at load (0: none): see pin_step_logits."""
        on = self.decode_step_logits and self.pin_step_logits and self.device.startswith("cuda")
        return self.decode_tokens if on else 0

    def max_context(self, model: ModelSpec) -> int:
        return max([*model.decode_contexts, *model.prefill_contexts, self.prompt_len, self.long_context or 0]
                   ) + self.decode_tokens + 8


def _tiny(name: str, quant: str, seed: int, role: str, **kw) -> ModelSpec:
    return ModelSpec(name=name, role=role, synth={"shape": "tiny", "quant": quant, "seed": seed}, **kw)


def _real(shape: str, quant: str, role: str, **kw) -> ModelSpec:
    return ModelSpec(name=f"qwen35-{shape}-{quant}", role=role, synth={"shape": shape, "quant": quant, "seed": 0}, **kw)


DEFAULT_PROFILES: dict[str, ProfileSettings] = {
    # CPU, tiny synthetic models, small contexts: CI and `tokengate demo`.
    "quick": ProfileSettings(
        device="cpu",
        clock="oncpu",
        models=[
            _tiny("qwen35-tiny", "q8_0", 0, "primary", decode_contexts=[32, 128], prefill_contexts=[32, 128]),
            _tiny("qwen35-tiny-f32", "f32", 1, "guard"),
        ],
        decode_tokens=6,
        pairs=4,
        inner=2,
        verify_reps=2,
        seeds=[0, 1, 2],
        prompts_per_seed=2,
        prompt_len=48,
        load_timeout_s=120.0,
        request_timeout_s=60.0,
        eval_timeout_s=900.0,
    ),
    # The default on any GPU worker (worker/queue/tasks.py): the seed bot's coverage. 9B Q4_K_M
    # primary (where the seed runtime's memory fallback appeared), decode to 32k, prefill to 32k,
    # and a guard of another shape and quant type (0.8B Q8_0: other GEMV/dequant kernels).
    # One timed request per sample and one verified rep keep the 32k gates inside 10 minutes.
    "standard": ProfileSettings(
        device="cuda",
        memory_limit_bytes=None,
        cpus="all",
        models=[
            _real("9b", "q4_k_m", "primary", decode_contexts=[128, 512, 4096, 16384, 32768],
                  prefill_contexts=[4096, 32768]),
            _real("0.8b", "q8_0", "guard", decode_contexts=[512, 4096], prefill_contexts=[4096]),
        ],
        decode_tokens=64,
        # 4 ABBA reps per pair (the H200's within-pair decode noise is ~0.1 %); up to 6 agreeing pairs:
        # the exact bound then needs 13 A/A pairs of history per gate instead of 24 with 4 (worker/gates/
        # noise.py history_needed), at about the same detectable change (3.6 vs 3.7 pair sd), so a fresh
        # worker calibrates in half the time; an A/A evaluation still stops after its first pair that misses.
        pairs=4,
        max_process_pairs=6,
        warmup=1,
        inner=1,
        seeds=[0, 1, 2],
        prompts_per_seed=4,
        prompt_len=256,
        verify_reps=1,
        request_timeout_s=300.0,
        eval_timeout_s=1800.0,
        long_context=4096,
        gate_max_process_pairs={"prefill@4096": 8},  # the shortest prefill is the noisiest
    ),
    # standard plus the long contexts: prefill 64k/128k (the seed bot once read 0.0 tok/s at 128k
    # and passed; here a context that does not fit is named in the verdict) and decode 64k; and the MoE
    # sibling as a third guard.
    "full": ProfileSettings(
        device="cuda",
        memory_limit_bytes=None,
        cpus="all",
        models=[
            _real("9b", "q4_k_m", "primary", decode_contexts=[128, 512, 4096, 16384, 32768, 65536],
                  prefill_contexts=[4096, 32768, 65536, 131072]),
            _real("0.8b", "q8_0", "guard", decode_contexts=[512, 4096, 32768], prefill_contexts=[4096]),
            # The cross-architecture guard: the MoE sibling (routed experts, top-k routing, shared expert)
            # runs kernels no dense model touches (tests/worker/guards/test_moe_guard.py).
            _real("35b-a3b", "q4_k_m", "guard", decode_contexts=[512, 4096], prefill_contexts=[4096]),
        ],
        decode_tokens=128,
        pairs=6,
        warmup=1,
        inner=1,
        seeds=[0, 1, 2, 3],
        prompts_per_seed=4,
        prompt_len=512,
        verify_reps=1,
        request_timeout_s=600.0,
        eval_timeout_s=7200.0,
        long_context=32768,
    ),
}

# Profiles whose verdicts may merge and count in a round in production: a CPU `quick` run measures
# a tiny model on a shared core, which says nothing about the runtime's speed on its GPUs.
MERGEABLE_PROFILES = frozenset({"standard", "full"})


def gpu_default_profile() -> str:
    """The profile a GPU worker runs when a job names none."""
    return "standard"


class EvalSettings(BaseModel):
    profile: str = "quick"  # quick | standard | full
    retries: int = Field(2, ge=0)  # automatic INFRA retries, with backoff
    retry_backoff_s: float = 30.0
    # Improvement tiers (relative speedup of the scored gate).
    tier_s: float = 0.02
    tier_m: float = 0.05
    tier_l: float = 0.15
    tier_xl: float = 0.40
    # Speed gates (worker/gates/noise.py): the chance that an A/A evaluation (identical revisions) has any
    # significant gate -- a false REJECT or a false tier -- is at most this, split evenly over the
    # evaluation's gates. A gate's floor is the `noise_floor_rank`-th largest |A/A pair delta| on
    # this host; the process pairs that must agree beyond it follow from the history's size.
    false_significance_rate: float = Field(1e-3, gt=0, lt=1)
    noise_floor_rank: int | None = Field(None, ge=1)  # None = chosen from the history's size (noise.py)
    # Below this a change is never significant. Tiny on purpose: the floor is the measured A/A
    # spread, which on an H200 is ±0.1-0.4 % for decode (a 2 % minimum threw that away).
    noise_floor_min: float = 0.001
    # Memory gates (GPU): head's peak GPU memory at a gate may exceed base's by this fraction plus
    # the slack (allocator rounding, the CUDA context) before it is a regression.
    memory_bound: float = Field(0.10, ge=0)
    memory_slack_bytes: int = Field(256 << 20, ge=0)
    # Used when this host has too little A/A history for the rate (said so in the receipt).
    noise_floor_uncalibrated: float = 0.10
    min_aa_samples: int = Field(5, ge=3)  # accuracy guards: fewer A/A seed scores than this = uncalibrated
    confidence: float = 0.95  # bootstrap interval level
    bootstrap_resamples: int = 2000
    # Accuracy guards: uncalibrated defaults; A/A calibration replaces them per model.
    top1_floor_default: float = 0.80
    top1_max_drop_min: float = 0.01  # δ never below this
    kl_bound_default: float = 0.5
    # --- verdicts a maintainer can trust (issue 13; worker/verdicts/rules.py, worker/calibration/) ---
    # A significant regression on any gate next to a significant speedup on another: "mixed" (named,
    # labelled, never merged) or "reject".
    regression_policy: Literal["mixed", "reject"] = "mixed"
    aa_max_age_days: float = Field(30.0, gt=0)  # A/A pair deltas older than this are not used
    drift_window: int = Field(8, ge=3)  # newest A/A pairs tested against the older history
    drift_alpha: float = Field(0.01, gt=0, lt=1)  # level of that test (a false alarm only costs recalibration)
    # Floors are widened by the host's noise ratio now/history (worker/calibration/scale.py): its upper
    # confidence bound at this level, over the newest `drift_window` A/A pairs of all the model's gates.
    noise_scale_check: bool = True
    noise_scale_confidence: float = Field(0.8, ge=0.5, lt=1)
    # One fresh base-vs-base process pair per evaluation, recorded as A/A history (keeps the null true).
    sentinel_aa_pair: Literal["gpu", "always", "never"] = "gpu"
    auto_calibrate: bool = True  # a GPU worker records A/A pairs of main until every gate is calibrated
    # After main's runtime package (this folder of the revisions) changed, each gate's floor is checked
    # against `drift_window` fresh A/A pairs of it before it is used (worker/calibration/runtime_change.py).
    runtime_check: bool = True
    runtime_path: str = "runtime"
    calibration_pairs_target: int = Field(0, ge=0)  # 0 = the fewest that meet the rate; more = finer floors
    confirm_head_faults: bool = True  # one confirming retry before a head fault becomes a failure verdict
    # Accuracy guards, paired against base on the same prompts: head KL <= kl_ratio_max * base KL +
    # kl_abs_tol (calibration widens the ratio to A/A's own spread).
    kl_ratio_max: float = Field(1.5, gt=1)
    kl_abs_tol: float = Field(1e-6, ge=0)
    # Development only: run under whatever sandbox layers work when the full sandbox cannot be set up.
    # Every verdict made so says so in its first line and is never merged.
    sandbox_dev_override: bool = False
    profiles: dict[str, ProfileSettings] = Field(default_factory=lambda: dict(DEFAULT_PROFILES))

    def profile_settings(self, name: str | None = None) -> ProfileSettings:
        name = name or self.profile
        try:
            return self.profiles[name]
        except KeyError:
            raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(self.profiles)}") from None

    def with_profile(self, name: str, **fields) -> "EvalSettings":
        """These settings with profile `name`'s fields replaced by `fields` (the other profiles as they are)."""
        return self.model_copy(update={"profiles": {**self.profiles,
                                                    name: self.profile_settings(name).model_copy(update=fields)}})

    def tier_for(self, rel_change: float) -> str:
        for tier, bar in (("XL", self.tier_xl), ("L", self.tier_l), ("M", self.tier_m), ("S", self.tier_s)):
            if rel_change >= bar:
                return tier
        return "none"
