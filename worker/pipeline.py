"""One evaluation end to end: checkout → sandboxed revisions → guards → gates → verdict + receipt.

Runs in-process (the CLI) or inside the Celery task; it never talks to GitHub or a database.
Every failure path ends in an EvalResult: INFRA (not the PR's fault, retried), BUILD_FAILED
(the head does not build/import/follow the protocol), REJECT, or a tier.
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import os
import shutil
import site
import sys
import time
import traceback
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator

from worker import models as model_files
from worker import compile_cache, sandbox, telemetry
from worker.verdicts import attribution
from worker.verdicts import rules as verdict_rules
from worker.calibration import history, sentinel
from worker.calibration.aa_store import AAStore
from worker.calibration.key import calibration_key
from worker.gates.bench import GateSpec, gate_specs, run_sweep
from worker.gates.confirm import confirming_gates
from worker.gates.judge import (ModelOutcome, gate_results, judge_memory, judge_timed_logits, merge_checks,
                               no_pass_possible, pair_deltas)
from worker.gates.verify import check_sweep_logits, drop_step_logits, verify_sweep
from worker.gates.idle_gpu import IdleGpuCheck, not_applicable
from worker.checkout import CheckoutError, MergeConflict, Revision, checkout_pair, remove_worktree, subtree_id
from worker.config import EvalSettings, ModelSpec, ProfileSettings
from worker.verdicts.faults import EvalFault, classify, infra
from worker.guards.scoring import guard_bounds, guard_key, guard_result, reference_version, score_revisions
from worker.harness.client import RevisionFault, RevisionProcess, bounded_memory, short_text
from worker.gates.noise import GateNull
from worker.paths import cache_dir
from worker.records import EvalResult, InfraKind, Verdict

HARNESS_VERSION = "1.0"
Progress = Callable[..., None]


@dataclass
class Job:
    repo: str  # path or URL of the repository (read-only clone)
    base_ref: str
    head_ref: str
    base_sha: str | None = None  # exact SHAs when the bot already knows them
    head_sha: str | None = None
    repo_full_name: str | None = None
    pr_number: int | None = None
    profile: str = "quick"
    models: list[str] | None = None  # None = every model of the profile
    device: str | None = None  # overrides the profile's device
    attempt: int = 1
    eval_id: str | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        known = {f for f in cls.__dataclass_fields__}
        d = dict(d)
        if "repo_url" in d and "repo" not in d:
            d["repo"] = d.pop("repo_url")
        return cls(**{k: v for k, v in d.items() if k in known})


def deployed_runtime_root() -> Path:
    """The directory holding the deployed service's own `runtime` package (the trusted reference)."""
    spec = importlib.util.find_spec("runtime")
    if spec is None or not spec.origin:
        raise RuntimeError("the deployed runtime package is not importable")
    return Path(spec.origin).resolve().parent.parent


def _noop(*_a, **_k):
    pass


def _pin_report(proc: RevisionProcess, resp: dict, rows: int) -> dict | None:
    """The driver's word on the rows it page-locked (pin_logits), kept short. Base's is checked against the
    parent's own figure: a host that would not page-lock them for base would time base's per-step copies
    through pageable pages (+2-7 % of a generate) while a head can lock its own, so the two would not be
    timed alike (INFRA, never the PR's). A base with no CUDA in its process makes no device copies, so there is
    nothing to page-lock and nothing asymmetric. A head's word is only recorded: its pinning is its own business."""
    if rows <= 0:
        return None
    said = resp.get("pinned") if isinstance(resp.get("pinned"), dict) else {}
    got = said.get("bytes")
    want = proc.shm.pinned_bytes(rows, int(resp["vocab_size"])) if proc.shm is not None else None
    report = {"bytes_reported": got if type(got) is int else None, "expected": want,
              "why": short_text(said.get("why"))}
    if proc.role == "base" and want is not None and got != want and said.get("cuda") is not False:
        raise RevisionFault("base", "load", "sandbox", f"the host did not page-lock the {rows} per-step logits "
                            f"rows for base ({got!r} of {want} bytes: {report['why']}); base and head would not "
                            "be timed alike")
    return report


def _check_protocol(role: str, hello: dict) -> None:
    if hello.get("protocol") != 1:
        raise RevisionFault(role, "start", "protocol",
                            f"runtime.PROTOCOL_VERSION is {hello.get('protocol')!r}, the harness speaks 1")


class Evaluation:
    def __init__(self, job: Job, settings: EvalSettings | None = None, *, trusted_root: Path | None = None,
                 store: AAStore | None = None, workdir: Path | None = None, progress: Progress | None = None,
                 record_aa: bool = False, secrets: list[str] | None = None, keep_workdir: bool = False):
        self.job = job
        self.settings = settings or EvalSettings()
        prof = self.settings.profile_settings(job.profile)
        if job.device:
            prof = prof.model_copy(update={"device": job.device})
        if job.models:  # selects primary models; guard models run for every PR
            wanted = set(job.models)
            unknown = wanted - {m.name for m in prof.models}
            if unknown:
                raise ValueError(f"unknown model(s) {sorted(unknown)} for profile {job.profile!r}; "
                                 f"choose from {[m.name for m in prof.models]}")
            keep = [m for m in prof.models if m.name in wanted or m.role == "guard"]
            if not any(m.role == "primary" for m in keep):
                raise ValueError(f"--models {sorted(wanted)} names no primary model of profile {job.profile!r}")
            prof = prof.model_copy(update={"models": keep})
        self.profile: ProfileSettings = prof
        self.trusted_root = Path(trusted_root) if trusted_root else deployed_runtime_root()
        self.store = store or AAStore()
        self.eval_id = job.eval_id or uuid.uuid4().hex[:12]
        self.workdir = Path(workdir) if workdir else cache_dir() / "evals" / self.eval_id
        self._user_progress = progress or _noop
        self._deadline: float | None = None
        self.record_aa = record_aa
        self.secrets = list(secrets or [])
        self.keep_workdir = keep_workdir
        # A/A history key: GPU UUID + driver + torch/triton (CPU: model + count), not the hostname.
        self.host = calibration_key(prof.device)
        self._ctor = dict(trusted_root=trusted_root, store=self.store, progress=progress, record_aa=record_aa,
                          secrets=secrets, keep_workdir=keep_workdir)
        self.revs: dict[str, Revision] = {}  # checked-out base and head (fresh process pairs start from them)
        self.base_runtime: str | None = None  # the base's runtime tree id (worker/calibration/runtime_change.py)
        self.not_measured: dict[str, str] = {}  # model -> why it was not measured (the verdict was settled)

    def upkeep(self) -> dict:
        """What the evaluation owes the service after its verdict (the A/A sentinel pair): call it once the
        verdict is out, before the next job on this device."""
        return sentinel.record_owed(self)

    def progress(self, event: str, **info) -> None:
        """Report progress; also where the whole-evaluation time limit is enforced."""
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise infra(InfraKind.TIMEOUT, f"the evaluation ran past its {self.profile.eval_timeout_s:.0f} s limit "
                                           f"(at: {event} {info.get('model', '')})")
        self._clock_phase(event, info)
        self._user_progress(event, **info)

    def _clock_phase(self, event: str, info: dict) -> None:
        """Per-phase wall times for the receipt: a phase lasts until the next progress event."""
        if event == "step":
            return
        now = time.monotonic()
        phases = self.__dict__.setdefault("_phases", [])
        if phases:
            phases[-1]["seconds"] = round(now - phases[-1].pop("_t0"), 3)
        if event != "done":
            phases.append({"phase": event, "model": info.get("model"), "pair": info.get("pair"), "_t0": now})

    # -- entry -----------------------------------------------------------------------------
    def run(self) -> EvalResult:
        """One evaluation; a provisional head fault is confirmed by one fresh attempt
        (worker/verdicts/attribution.py), and a tier after a failed earlier attempt is withheld."""
        first = self.run_once()
        job2 = Job(**{**asdict(self.job), "eval_id": f"{self.eval_id}-confirm"})
        r = attribution.confirm_head_fault(
            first, lambda: Evaluation(job2, self.settings, **{**self._ctor, "workdir": None}).run_once(),
            self.settings.confirm_head_faults)
        if r.verdict is Verdict.INFRA:
            sentinel.forgive(self, f"the verdict is INFRA ({r.infra_kind.value if r.infra_kind else 'infra'})")
        return attribution.block_after_failed_attempts(r, self.job.attempt)

    def run_once(self) -> EvalResult:
        t0 = time.monotonic()
        self._deadline = t0 + self.profile.eval_timeout_s
        receipt = self._receipt_head()
        window = telemetry.ResourceWindow(self.profile.device).open()
        revs: dict[str, Revision] = {}
        git_dir = None
        outcomes: dict[str, ModelOutcome] = {}
        try:
            iso = sandbox.detect_isolation()
            if not iso.full and not self.settings.sandbox_dev_override:
                raise infra(InfraKind.SANDBOX_UNAVAILABLE, f"the full sandbox cannot be set up on this host: {iso.reason}")
            self.progress("checkout")
            self.workdir.mkdir(parents=True, exist_ok=True)
            git_dir, base, head = checkout_pair(self.job.repo, self.job.base_ref, self.job.head_ref, self.workdir,
                                                self.job.base_sha, self.job.head_sha)
            revs = self.revs = {"base": base, "head": head}
            self._git_dir = git_dir  # the A/A upkeep checks out its base again after the verdict (sentinel.py)
            self.base_runtime = subtree_id(git_dir, base.sha, self.settings.runtime_path)
            receipt["revisions"] = {r: {"ref": v.ref, "sha": v.sha, "merged_with_base": v.merged_sha}
                                    for r, v in revs.items()}
            self.progress("models")
            resolved = [model_files.resolve(spec, self.trusted_root, self.profile.device) for spec in self.profile.models]
            procs = self._main_procs = self.make_procs(revs, [m.path for m in resolved])
            try:
                with ExitStack() as stack:
                    for role in ("base", "head", "reference"):
                        stack.enter_context(procs[role])
                    self.start(procs)
                    for m in resolved:
                        why = self._settled(outcomes)
                        if why is not None:  # nothing measured from here on could change the verdict
                            self.not_measured[m.spec.name] = f"not measured: the verdict is already REJECT ({why})"
                            continue
                        outcomes[m.spec.name] = self._model(m, procs)
            finally:
                receipt["processes"] = {r: self._usage(proc) for r, proc in procs.items()}
                receipt["worker_peak_gpu_memory_bytes"] = getattr(self, "_gpu_peak", {}).get("worker")
            result = self.decide(outcomes)
        except EvalFault as f:
            result = self._fault_result(f)
        except MergeConflict as exc:  # what would land does not exist: the PR's state, nothing to retry
            result = self._fault_result(EvalFault(Verdict.BUILD_FAILED, f"{exc}; rebase the PR on "
                                                  f"{self.job.base_ref} to have it measured"))
        except CheckoutError as exc:
            result = self._fault_result(infra(InfraKind.CHECKOUT_FAILURE, str(exc)))
        except model_files.ModelError as exc:
            result = self._fault_result(infra(InfraKind.INTERNAL_ERROR, f"model file: {exc}"))
        except Exception as exc:  # noqa: BLE001 - fail closed: an unexpected error is never a verdict on the PR
            if type(exc).__name__ == "SoftTimeLimitExceeded":  # Celery's time limit, raised into our frame
                result = self._fault_result(infra(InfraKind.TIMEOUT, "the evaluation ran past its time limit"))
            else:
                result = self._fault_result(infra(InfraKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}",
                                              traceback.format_exc()[-3000:]))
        finally:
            if git_dir is not None:
                for rev in revs.values():
                    remove_worktree(git_dir, rev)
            if not self.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        receipt["resources"] = {"window": window.close().to_dict(),
                                "foreign_gpu_checks": getattr(self, "_gpu_checks", None)
                                or {"value": None, "reason": "not a CUDA evaluation"}}
        receipt["models"] = {k: v.receipt for k, v in outcomes.items()}
        receipt["models_not_measured"] = dict(self.not_measured)
        result.base_sha = revs["base"].sha if "base" in revs else (self.job.base_sha or "")
        result.head_sha = revs["head"].sha if "head" in revs else (self.job.head_sha or "")
        result.duration_s = round(time.monotonic() - t0, 3)
        receipt["duration_s"] = result.duration_s
        receipt["verdict"] = result.verdict.value
        self._clock_phase("done", {})
        receipt["phases"] = getattr(self, "_phases", [])
        receipt["pair_load_seconds"] = getattr(self, "_pair_loads", [])
        iso = sandbox.detect_isolation()
        if self.settings.sandbox_dev_override and not iso.full:
            result.sandbox_override = True
            result.summary = (f"DEVELOPMENT OVERRIDE: incomplete sandbox ({iso.method}: {iso.reason}); this verdict "
                              f"is never merged. {result.summary}")
        result.receipt = receipt
        self._user_progress("done", verdict=result.verdict.value)
        return result

    # -- processes -------------------------------------------------------------------------
    def make_procs(self, revs: dict[str, Revision], model_paths: list[Path]) -> dict[str, RevisionProcess]:
        """Base, head and the trusted reference, each in its own sandboxed driver process."""
        p = self.profile
        # Home is hidden (keys, tokens, config files); the Python install stays visible even if it
        # lives there (pyenv), and so do the model files.
        python = {Path(sys.prefix), Path(sys.base_prefix), *(Path(x) for x in site.getsitepackages())}
        common = dict(gpu=p.device.startswith("cuda"), allow_degraded=self.settings.sandbox_dev_override,
                      memory_limit_bytes=p.memory_limit_bytes or (64 << 30),  # cgroup memory.max (tmpfs counts)
                      cpus=p.cpu_set(), hide=[Path.home()],
                      read_only=sorted({Path(m) for m in model_paths} | {x for x in python if x.exists()}),  # the model FILES only
                      secrets=self.secrets,
                      env_extra={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if p.device == "cpu" else {})
        d = self.workdir / "proc"
        # Imports and loads overlap on every allowed core; run_sweep pins base and head to the
        # profile's CPUs before timing anything. The reference is never timed.
        procs = {
            "base": RevisionProcess("base", revs["base"].root, d / "base", pin_at_start=False, **common),
            "head": RevisionProcess("head", revs["head"].root, d / "head", pin_at_start=False, **common),
            "reference": RevisionProcess("reference", self.trusted_root, d / "reference", pin_at_start=False,
                                         **common),
        }
        keys = {"base": revs["base"].measured_sha, "head": revs["head"].measured_sha,
                "reference": "trusted-" + reference_version(self.trusted_root)}
        for role, proc in procs.items():
            self._use_compile_cache(proc, keys[role])
        return procs

    @staticmethod
    def _use_compile_cache(proc: RevisionProcess, key: str) -> None:
        """Give the process its own revision's compile cache (worker/compile_cache.py): writable, per SHA."""
        d = compile_cache.compile_cache_dir(key)
        proc.writable = [*proc.writable, d]
        proc.disk_max_bytes = compile_cache.MAX_BYTES_PER_REVISION  # read now, not at import: a test lowers it
        proc.env_extra = {**proc.env_extra, **compile_cache.compile_cache_env(d)}

    @contextmanager
    def fresh_pair(self, revs: dict[str, Revision], spec: ModelSpec, path: Path, n: int,
                   vocab: int | None = None) -> Iterator[dict[str, RevisionProcess]]:
        """A new base and head process (started and loaded), for process pair `n` of a measurement.

        Odd pairs start and load head first, so any start-order advantage changes sides.
        """
        p = self.profile
        procs = self.make_procs(revs, [path])
        order = ("base", "head") if n % 2 == 0 else ("head", "base")
        try:
            with ExitStack() as stack:
                for r in order:
                    procs[r].workdir = self.workdir / "proc" / f"pair{n}" / r
                    stack.enter_context(procs[r])
                    procs[r].start(None)
                for r in order:
                    _check_protocol(r, procs[r].finish_start(p.load_timeout_s))
                    procs[r].begin("load", path=str(path), device=p.device, max_context=p.max_context(spec),
                                   backend=p.backend, pin_rows=p.pin_rows())
                for r in order:
                    resp, secs = procs[r].finish(phase="load", timeout=p.load_timeout_s)
                    got = resp["vocab_size"]
                    self.__dict__.setdefault("_pair_loads", []).append(
                        {"model": spec.name, "pair": n, "role": r, "load_s": round(secs, 3),
                         "pinned": _pin_report(procs[r], resp, p.pin_rows())})
                    if vocab is not None and got != vocab:
                        raise RevisionFault(r, "load", "protocol", f"vocab {got} != reference {vocab}")
                yield {r: procs[r] for r in ("base", "head")}
        except RevisionFault as f:
            raise classify(f, spec.name, self._memory_context(procs)) from f

    def start(self, procs: dict[str, RevisionProcess]) -> None:
        """Spawn all three at once (imports overlap), then collect their hellos."""
        p = self.profile
        self.progress("start")
        try:
            for role in ("base", "head", "reference"):
                procs[role].start(None)
            self._hellos = {}
            for role in ("base", "head", "reference"):
                self._hellos[role] = procs[role].finish_start(p.load_timeout_s)
                _check_protocol(role, self._hellos[role])
        except RevisionFault as f:
            raise classify(f, "(import)", self._memory_context(procs)) from f

    def load(self, spec: ModelSpec, procs: dict[str, RevisionProcess], path: Path) -> int:
        """Load the model in all three processes at once; returns the vocabulary size."""
        p = self.profile
        self.progress("load", model=spec.name)
        for role in ("base", "head", "reference"):
            procs[role].begin("load", path=str(path), device=p.device, max_context=p.max_context(spec),
                              backend="reference" if role == "reference" else p.backend,
                              pin_rows=0 if role == "reference" else p.pin_rows())
        vocab = {}
        for role in ("base", "head", "reference"):
            resp, secs = procs[role].finish(phase="load", timeout=p.load_timeout_s)
            vocab[role] = resp["vocab_size"]
            if role != "reference":
                self._hellos[role].setdefault("pinned", {})[spec.name] = _pin_report(procs[role], resp, p.pin_rows())
            self._hellos[role].setdefault("load_seconds", {})[spec.name] = round(secs, 3)
            for k in ("torch", "triton"):
                self._hellos[role][k] = self._hellos[role].get(k) or short_text(resp.get(k))
        for role in ("base", "head"):
            if vocab[role] != vocab["reference"]:
                raise RevisionFault(role, "load", "protocol", f"vocab {vocab[role]} != reference {vocab['reference']}")
        return vocab["reference"]

    # -- one model ---------------------------------------------------------------------------
    def _model(self, resolved: model_files.ResolvedModel, procs: dict[str, RevisionProcess]) -> ModelOutcome:
        p, spec = self.profile, resolved.spec
        self.progress("model", model=spec.name)
        gates = gate_specs(spec, p)
        out = ModelOutcome()
        out.receipt = {"gguf_sha256": resolved.sha256, "path": str(resolved.path), "role": spec.role}
        try:
            vocab = self.load(spec, procs, resolved.path)
            self._foreign_gpu_check(procs, "before measuring")
            self.progress("accuracy", model=spec.name)
            ref_version = reference_version(self.trusted_root)
            scores = score_revisions({"base": procs["base"], "head": procs["head"]}, procs["reference"],
                                     vocab=vocab, model_sha=resolved.sha256, ref_version=ref_version, profile=p)
            gkey = guard_key(resolved.sha256, ref_version)
            bounds = guard_bounds(self.store.guard_aa(gkey, self.job.profile), len(p.seeds), self.settings)
            out.receipt["guard_bounds"] = asdict(bounds)
            out.receipt["long_context"] = {"positions": scores["head"].long_context,
                                           "scored": scores["head"].long_scored, "note": scores["head"].note}
            if self.record_aa:
                self._record_guard_aa(gkey, scores)
            out.guard = guard_result(spec.name, scores, bounds)
            out.receipt["accuracy"] = {r: [asdict(s) for s in sc.seeds] for r, sc in scores.items()}
            out.receipt["guard_bounds"] = asdict(bounds)
            out.receipt["reference_version"] = ref_version
            why = self._settled({spec.name: out})
            if why is not None:  # accuracy first: a failed guard is REJECT whatever the gates would say
                out.receipt["gates_not_measured"] = f"speed gates not measured: the verdict is already REJECT ({why})"
            elif gates:
                self.measure(spec, gates, procs, vocab, resolved.sha256, out, sweep_id=self.eval_id,
                             more_pairs=lambda n: self.fresh_pair(self.revs, spec, resolved.path, n, vocab))
                sentinel.owe(self, spec, gates, resolved, vocab, out)
            if self.record_aa:
                self.record_pair_deltas(spec, out, sha=self.job.base_sha)
        except RevisionFault as f:
            raise classify(f, spec.name, self._memory_context(procs)) from f
        return out

    def measure(self, spec: ModelSpec, gates: list[GateSpec], procs: dict[str, RevisionProcess], vocab: int,
                model_sha: str, out: ModelOutcome, sweep_id: str,
                more_pairs: Callable[[int], ContextManager[dict[str, RevisionProcess]]] | None = None) -> ModelOutcome:
        """One A/B measurement of every gate (into `out`): an ABBA sweep on the given process pair,
        then sweeps on fresh pairs from `more_pairs` while some gate stays beyond its floor in every
        pair so far and needs more agreeing pairs (worker/gates/noise.py); output check; statistics."""
        p = self.profile
        nulls = self._nulls(spec.name, [g.name for g in gates])
        self.progress("gates", model=spec.name, total=p.pairs * len({g.context for g in gates}))
        sweeps = [self._sweep(procs, gates, vocab, model_sha, f"{sweep_id}", spec)]
        self._foreign_gpu_check(procs, "after measuring")
        out.receipt["memory_reported_by_revision"] = {
            r: bounded_memory(procs[r].request("memory", phase="measure", timeout=p.request_timeout_s)[0].get("memory"))
            for r in ("base", "head")}
        for r in ("base", "head"):  # done with this model: room for fresh pairs beside the reference (driver.unload)
            procs[r].request("unload", phase="measure", timeout=p.request_timeout_s)
        reference, logit_cache = procs["reference"], {}  # prompt key -> the reference's last-position logits
        checks: list[dict] = []
        logit_checks: list[dict] = []
        pending = list(sweeps)  # timed, outputs not yet checked (their kept per-step logits held until then)

        def verify(every_rep: bool = True) -> None:
            if not pending:
                return
            self.progress("verify", model=spec.name)
            for sw in pending:  # each pair's own gates (a confirming pair times those still in play)
                checks.append(verify_sweep(sw, sw.gates, reference, logit_cache, timeout=p.request_timeout_s,
                                           tie_tol=p.output_tie_tol))
                logit_checks.append(check_sweep_logits(sw, sw.gates, reference, logit_cache,
                                                       timeout=p.request_timeout_s, every_rep=every_rep))
            pending.clear()

        plan = None  # which gates the confirming pairs time (worker/gates/confirm.py)
        while more_pairs is not None:
            deltas = {g.name: pair_deltas(sweeps, g.name) for g in gates}
            plan = confirming_gates(gates, deltas, nulls, plan)
            if not plan.timed:
                break
            if not any(nulls[g].side(d) < 0 for g, d in deltas.items()):
                verify()  # no gate can end slower (a side only ever drops to 0): every pair gets checked, so now
            self.progress("confirm", model=spec.name, pair=len(sweeps) + 1,
                          of=max(nulls[g.name].pairs for g in plan.timed))
            # The first pair stays alive for the next model: frozen meanwhile, so its head can neither load the GPU
            # while the fresh pair is timed nor answer the fresh head through their shared compile cache.
            with _frozen(procs["base"], procs["head"]), more_pairs(len(sweeps)) as pair:
                sweeps.append(self._sweep(pair, plan.timed, vocab, model_sha, f"{sweep_id}/pair{len(sweeps)}", spec))
                # The first pair and the reference are still alive (and ours).
                self._foreign_gpu_check({**procs, **{f"pair{len(sweeps)}-{r}": q for r, q in pair.items()}},
                                        "after measuring")
            pending.append(sweeps[-1])
        partly = no_pass_possible(spec.name, gates, sweeps, nulls)
        if partly is None:
            verify()  # the timing cannot see when its outputs are checked: after it, every pair
        else:  # the first pair's verified rep only (base's own bars; the head's gross errors), no confirming pair
            for sw in pending[1:]:  # nothing will read their kept per-step logits
                drop_step_logits(sw)
            del pending[1:]
            verify(every_rep=False)
            out.receipt["outputs_partly_verified"] = partly
        if plan is not None and plan.left_out:
            out.receipt["gates_not_confirmed"] = plan.left_out
        out.gates = gate_results(spec, gates, sweeps, merge_checks(checks), nulls, out, settings=self.settings,
                                 profile=p, gate_count=self.gate_count())
        judge_memory(spec, gates, sweeps[0], out, settings=self.settings, device=p.device)
        judge_timed_logits(spec.name, gates, logit_checks, out, profile=p)
        out.receipt["clock"] = p.clock
        out.receipt["process_pairs"] = len(sweeps)
        out.receipt["samples_tok_s"] = {f"{r}/{g.name}": [sw.values(r, g.name) for sw in sweeps]
                                        for g in gates for r in ("base", "head")}
        out.receipt["wall_seconds"] = {f"{r}/{g.name}": [[s.wall_seconds for s in sw.samples.get((r, g.name), [])]
                                                         for sw in sweeps] for g in gates for r in ("base", "head")}
        out.receipt["idle_cpu_s"] = [sw.idle_cpu_s for sw in sweeps]
        out.receipt["idle_gpu"] = [sw.idle_gpu for sw in sweeps]
        return out

    def _sweep(self, procs: dict[str, RevisionProcess], gates: list[GateSpec], vocab: int, model_sha: str,
               sweep_id: str, spec: ModelSpec):
        p = self.profile
        verify_reps = self._draw_verify_reps()
        idle = None
        if p.device.startswith("cuda"):  # the frozen one's queued kernels could still run: NVML looks
            idle = IdleGpuCheck(telemetry.nvml(telemetry.device_index(p.device)), p.idle_gpu_settle_s)
        sweep = run_sweep({"base": procs["base"], "head": procs["head"]}, gates, vocab=vocab, model_sha=model_sha,
                          pairs=p.pairs, warmup=p.warmup, inner=p.inner, clock=p.clock, sweep_id=sweep_id,
                          timeout=p.request_timeout_s, on_step=lambda: self.progress("step", model=spec.name),
                          gpu_memory=self._gpu_bytes if p.device.startswith("cuda") else None,
                          idle_check=idle.check if idle is not None else None,
                          idle_retimes=p.idle_gpu_retimes, idle_max_void=p.idle_gpu_max_void,
                          step_logits=p.decode_step_logits, keep_steps=verify_reps)
        sweep.verify_reps = verify_reps
        sweep.idle_gpu = ({**idle.receipt(), "voided": sweep.idle_voids} if idle is not None
                          else not_applicable("CPU evaluation: no GPU kernels to be in flight"))
        return sweep

    def _gpu_bytes(self, proc: RevisionProcess) -> int | None:
        """GPU memory of one revision's process tree, read by us (NVML), never by the revision."""
        if proc.proc is None:
            return None
        nv = telemetry.nvml(telemetry.device_index(self.profile.device))
        return nv.process_memory(set(sandbox.tree_pids(proc.proc.pid)))

    def _draw_verify_reps(self) -> set[int] | None:
        """The reps whose outputs are verified (None: all). Drawn before timing so that only their
        per-step logits are kept, never sent: every timed request looks the same to the revision."""
        p = self.profile
        if p.verify_reps is None:
            return None
        import secrets as _secrets

        return set(_secrets.SystemRandom().sample(range(p.pairs), min(p.verify_reps, p.pairs)))

    def gate_count(self) -> int:
        """Gates of one evaluation (every model's): the false-significance rate is split over them."""
        return max(1, sum(len(m.gate_names()) for m in self.profile.models))

    def protocol_key(self, model: str) -> str:
        return self.profile.protocol_key(next(m for m in self.profile.models if m.name == model))

    def _nulls(self, model: str, gates: list[str]) -> dict[str, GateNull]:
        """The gates' nulls from their unexpired, drift-tested A/A history, widened by the host's noise
        ratio (worker/calibration/history.py)."""
        return history.current_nulls(self.store, self.host, self.job.profile, self.protocol_key(model), model,
                                     {g: self.profile.max_pairs_for(g) for g in gates}, self.settings,
                                     per_gate_rate=self.settings.false_significance_rate / self.gate_count(),
                                     runtime=self.base_runtime)

    def _null(self, model: str, gate: str) -> GateNull:
        return self._nulls(model, [gate])[gate]

    def _sample_gpu_memory(self, procs: dict[str, RevisionProcess]) -> dict[str, int | None]:
        """NVML's per-process GPU memory of each revision's tree and of this worker ("worker": the guards' scoring
        runs on the same card), as read now; the receipt keeps each one's maximum."""
        if not self.profile.device.startswith("cuda"):
            return {}
        peaks = self.__dict__.setdefault("_gpu_peak", {})
        own = telemetry.nvml(telemetry.device_index(self.profile.device)).process_memory({os.getpid()})
        now = {"worker": own, **{label: self._gpu_bytes(proc) for label, proc in procs.items()}}
        for label, used in now.items():
            if used is not None:
                peaks[label] = max(peaks.get(label, 0), used)
        return now

    def _foreign_gpu_check(self, procs: dict[str, RevisionProcess], when: str) -> None:
        self._sample_gpu_memory(procs)
        if not self.profile.device.startswith("cuda"):
            return
        nv = telemetry.nvml(telemetry.device_index(self.profile.device))
        pids = nv.compute_pids()
        checks = self.__dict__.setdefault("_gpu_checks", [])
        if pids is None:
            checks.append({"when": when, "checked": False, "reason": nv.reason or "NVML process list unavailable"})
            return
        checks.append({"when": when, "checked": True, "gpu_pids": pids})
        ours = {os.getpid()}
        for proc in procs.values():
            if proc.proc is not None:
                ours.update(sandbox.tree_pids(proc.proc.pid))
        visible = [x for x in pids if Path(f"/proc/{x}").exists()]
        foreign = [x for x in visible if x not in ours]  # a process we can see that is not ours
        unseen = [x for x in pids if x not in visible]
        if unseen and not ours.intersection(pids):
            # NVML speaks another PID namespace (the worker runs in a container): count instead.
            live = sum(1 for proc in procs.values() if proc.proc is not None)
            live += _own_cuda_context()  # the guards' arithmetic (worker/guards/arith.py) runs on our GPU
            if len(unseen) > live:
                foreign += unseen
        if foreign:
            raise infra(InfraKind.FOREIGN_GPU_PROCESS, f"{when}: foreign process(es) {foreign} on "
                                                       f"{self.profile.device}; timings would be shared")

    def _usage(self, proc: RevisionProcess) -> dict:
        u = asdict(proc.usage)
        u["hello"] = getattr(self, "_hellos", {}).get(proc.role)
        u["isolation"] = proc.isolation  # what this process actually ran under (uid, cgroup limits read back)
        if not self.profile.device.startswith("cuda"):
            u["peak_gpu_memory_bytes"] = None
            u["peak_gpu_memory_reason"] = "CPU evaluation"
        else:
            u["peak_gpu_memory_bytes"] = getattr(self, "_gpu_peak", {}).get(proc.role)
            if u["peak_gpu_memory_bytes"] is None:
                u["peak_gpu_memory_reason"] = "NVML reported no per-process memory for this process"
        return u

    def record_pair_deltas(self, spec: ModelSpec, out: ModelOutcome, sha: str | None = None) -> None:
        """The first process pair of an A/A measurement: one independent draw of each gate's null.

        Only the first: whether confirming pairs ran depends on the first pair's value, and the
        bound in worker/gates/noise.py wants draws that were taken whatever the earlier ones were.
        """
        protocol = self.protocol_key(spec.name)
        for gate, deltas in out.pair_deltas.items():
            self.store.add_pair_delta(self.host, self.job.profile, protocol, spec.name, gate, deltas[0], sha=sha,
                                      runtime=self.base_runtime)

    def _record_guard_aa(self, gkey: str, scores) -> None:
        """A/A seed scores of both roles (the guards' calibration, keyed by model sha256 + reference)."""
        for b, h in zip(scores["base"].seeds, scores["head"].seeds):
            self.store.add_guard_aa(gkey, self.job.profile, b.seed, (b.top1, b.kl_mean), (h.top1, h.kl_mean),
                                    sha=self.job.base_sha)

    def _memory_context(self, procs: dict[str, RevisionProcess]) -> dict:
        """Base's measured peak memory and the limit, for attributing an OOM (worker/verdicts/faults.py); on a
        GPU also what each process (this worker's own included) held at the fault: the card is shared."""
        p = self.profile
        base = procs.get("base")
        if p.device.startswith("cuda"):
            live = dict(getattr(self, "_main_procs", {}))  # a fresh pair's fault: the first pair and reference too
            live.update({role if live.get(role) is proc else f"pair-{role}": proc for role, proc in procs.items()})
            held = self._sample_gpu_memory(live)  # base's reading now counts in its peak too
            total = telemetry.nvml(telemetry.device_index(p.device)).device().get("memory_total_bytes")
            return {"base_peak_bytes": getattr(self, "_gpu_peak", {}).get("base"),
                    "limit_bytes": total if isinstance(total, int) else None, "reason": "NVML per-process memory",
                    "gpu_held": held, "head_bound": 1 + self.settings.memory_bound,
                    "slack_bytes": self.settings.memory_slack_bytes}
        peak = None
        try:
            import psutil

            if base is not None and base.proc is not None:
                peak = sum(psutil.Process(x).memory_info().rss for x in sandbox.tree_pids(base.proc.pid)
                           if psutil.pid_exists(x))
        except Exception:  # noqa: BLE001 - a process that just exited: no reading
            peak = None
        if base is not None and base.usage.peak_tree_rss_bytes:
            peak = max(peak or 0, base.usage.peak_tree_rss_bytes)
        return {"base_peak_bytes": peak, "limit_bytes": p.memory_limit_bytes,
                "reason": None if peak is not None else "base process not running"}

    # -- verdict -----------------------------------------------------------------------------
    def _base_result(self, verdict: Verdict, summary: str) -> EvalResult:
        return EvalResult(repo=self.job.repo_full_name or self.job.repo, pr_number=self.job.pr_number,
                          base_sha=self.job.base_sha or "", head_sha=self.job.head_sha or "",
                          profile=self.job.profile, verdict=verdict, summary=summary, attempt=self.job.attempt)

    def _fault_result(self, f: EvalFault) -> EvalResult:
        if f.verdict == Verdict.INFRA:
            summary = (f"Infrastructure problem ({f.infra_kind.value}), not a measurement of this PR: {f.detail}")
        elif f.failure is not None:
            summary = f"Rejected: {f.detail} (the baseline ran the same work fine on this box)."
        else:
            summary = f"The head revision failed to build or run: {f.detail}"
        r = self._base_result(f.verdict, summary)
        r.infra_kind, r.infra_detail, r.failure = f.infra_kind, f.detail, f.failure
        tail = f.log_tail
        for s in self.secrets:
            if s and len(s) >= 6:
                tail = tail.replace(s, "[redacted]")
        r.build_log_tail = tail[-3000:] or None
        return r

    def _settled(self, outcomes: dict[str, ModelOutcome]) -> str | None:
        """Why the verdict is already REJECT (rules.settled); never while recording A/A pairs: calibration takes
        every model's draw whatever an earlier one showed (record_pair_deltas)."""
        if self.record_aa:
            return None
        done = outcomes.values()
        return verdict_rules.settled([o.guard for o in done if o.guard],
                                     [e for o in done for e in o.output_failures + o.memory_failures],
                                     [f"{g.model} {g.gate}" for o in done for g in o.gates if g.regression],
                                     self.settings)

    def decide(self, outcomes: dict[str, ModelOutcome]) -> EvalResult:
        gates = [g for o in outcomes.values() for g in o.gates]
        guards = [o.guard for o in outcomes.values() if o.guard]
        d = verdict_rules.decide(gates, guards, [e for o in outcomes.values() for e in o.output_failures + o.memory_failures],
                                 {k: v for o in outcomes.values() for k, v in o.uncalibrated.items()}, self.settings)
        r = self._base_result(d.verdict, d.summary)
        r.best_speedup, r.notes = d.best_speedup, list(d.notes or [])
        r.notes += [f"{model}: {why}" for model, why in self.not_measured.items()]
        r.notes += [f"{model}: {o.receipt[k]}" for model, o in outcomes.items()
                    for k in ("gates_not_measured", "outputs_partly_verified") if o.receipt.get(k)]
        for model, o in outcomes.items():  # one note per reason: the gates it names first
            by_why: dict[str, list[str]] = {}
            for gate, why in o.receipt.get("gates_not_confirmed", {}).items():
                by_why.setdefault(why, []).append(gate)
            r.notes += [f"{model} {', '.join(gs)}: {why}" for why, gs in by_why.items()]
        bounds = [f.get("bound") for o in outcomes.values() for f in o.receipt.get("noise_floors", {}).values()]
        if bounds and all(b is not None for b in bounds):  # the claim the comment relies on
            r.notes.append(f"chance that this evaluation shows a significant speed change where there is none: "
                           f"<= {sum(bounds):.1e} (A/A history of this worker; configured "
                           f"{self.settings.false_significance_rate:.0e})")
        widened: dict[str, float] = {}  # model -> its largest widening
        for g in gates:
            if g.floor_widening > 1.0:
                widened[g.model] = max(widened.get(g.model, 1.0), g.floor_widening)
        for model, c in sorted(widened.items()):
            r.notes.append(f"{model}: noise floors widened ×{c:.2f}: this worker's newest A/A pairs are noisier than "
                           f"the history the floors came from (upper {self.settings.noise_scale_confidence:.0%} bound "
                           "of the ratio), so smaller changes go undetected until that history is rebuilt")
        r.gates, r.guards = gates, guards
        return r

    def _receipt_head(self) -> dict:
        return {
            "kind": "tokengate_receipt",
            "harness_version": HARNESS_VERSION,
            "protocol": 1,
            "eval_id": self.eval_id,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "job": asdict(self.job),
            "host": telemetry.host_facts(self.profile.device),
            "host_key": self.host,
            "isolation": sandbox.detect_isolation().to_dict(),
            "trusted_runtime_root": str(self.trusted_root),
            "config": {"profile_name": self.job.profile, "profile": self.profile.model_dump(),
                       "eval": self.settings.model_dump(exclude={"profiles"})},
        }


def _own_cuda_context() -> int:
    torch = sys.modules.get("torch")
    return int(torch is not None and torch.cuda.is_initialized())


@contextmanager
def _frozen(*procs: RevisionProcess) -> Iterator[None]:
    for p in procs:
        p.freeze(True)
    try:
        yield
    finally:
        for p in procs:
            p.freeze(False)


def evaluate(job: Job, settings: EvalSettings | None = None, **kw) -> EvalResult:
    """One evaluation in this process, its upkeep (the A/A sentinel pair) taken before it returns."""
    ev = Evaluation(job, settings, **kw)
    result = ev.run()
    upkeep = ev.upkeep()
    if upkeep:
        result.receipt["upkeep"] = upkeep
    return result


def evaluate_with_retries(job: Job, settings: EvalSettings | None = None, *, sleep=time.sleep,
                          **kw) -> EvalResult:
    """INFRA results are retried with exponential backoff; the last one is returned plainly."""
    settings = settings or EvalSettings()
    attempts = settings.retries + 1
    first = job.attempt
    for i in range(attempts):
        job.attempt = first + i
        result = evaluate(job, settings, **kw)
        if result.verdict != Verdict.INFRA:
            return result
        if i < attempts - 1:
            sleep(settings.retry_backoff_s * 2 ** i)
    result.summary = (f"{result.summary} (still failing after {attempts} attempts; this says nothing about "
                      "the PR, and nothing was merged)")
    return result
