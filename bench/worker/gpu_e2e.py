"""The GPU path end to end, through the real Celery `gpu` task, on planted PRs (issue 19, item 4).

    python -m bench.worker.gpu_e2e --out DIR [--profile standard] [--cases aa,decode_slow,prefill_slow,accuracy_drift,speedup]
                            [--budget-s 480] [--max-pairs N] [--probe] [--redis-server PATH]

On the GPU box: starts a Redis server on a free local port, a Celery worker on queue `gpu` (the
task in worker/queue/tasks.py, TOKENGATE_DEVICE=cuda), makes a throwaway git repository from this
checkout with one branch per planted change, sends one `tokengate.evaluate` job per case and
waits for its EvalResult. Cases and the verdict each must give:

  aa             main vs main                                         none
  decode_slow    a Triton decode path does part of its work twice     REJECT
  prefill_slow   the prefill GEMMs without residual run twice         REJECT
  accuracy_drift the final norm's weights get 25 % per-channel noise  REJECT
  speedup        base = main made slower (decode_slow), head = a PR     a tier (S..XL)
                 on it that takes the slowdown out (main's code again)

Before the cases it makes the models once for the worker (synthesis on the GPU, timed) and, with
--probe, times a fresh process's model load with an empty and then a filled Triton cache (where
the load time goes). One receipt, DIR/gpu-e2e.json, rewritten after every step so a run cut short
still returns what it measured: per case the verdict, expected, the pipeline's per-phase times,
the GPU's noise per gate (process-pair deltas, sample spread), GGUF sha256s, host and config.
A case that would not fit in what is left of --budget-s is skipped, and the receipt says so.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=tokengate e2e", "-c", "user.email=e2e@tokengate.invalid"]

# Planted changes: (file, exact text, replacement). Each must match once on main
# (tests/bench/worker/test_gpu_e2e_plants.py builds them on the CPU, so a moved line fails CI, not a device call).
_FFN = ('                gemv(h, [mat[p + "ffn_gate.weight"], mat[p + "ffn_up.weight"]], b.ffn,\n'
        '                     norm_weight=vec[p + "post_attention_norm.weight"], eps=eps, swiglu=True, config=gc, q8=b.q8)\n')


def _indented(text: str, by: int = 4) -> str:
    return "".join(" " * by + line for line in text.splitlines(keepends=True))


DECODE_SLOW = ("runtime/triton/decode.py", _FFN,
               _FFN + "                if layer % 2 == 0:  # planted: the FFN's gate/up GEMV again (same result)\n"
               + _indented(_FFN))
_MM = "    if not _use_scratch(engine, x.shape[0]):\n        return qgemm(x, w.data, w.qtype, w.cols, out=out, residual=residual)\n"
PREFILL_SLOW = ("runtime/triton/prefill.py", _MM,
                "    if residual is None:  # planted: the projection GEMM twice (same result)\n"
                "        _mm_once(engine, w, x, out)\n" + _MM)
PREFILL_HELPER = ("\n\ndef _mm_once(engine, w, x, out):\n"
                  "    if not _use_scratch(engine, x.shape[0]):\n"
                  "        qgemm(x, w.data, w.qtype, w.cols, out=out)\n"
                  "    else:\n"
                  "        out.copy_(x.to(torch.bfloat16) @ _dequant_scratch(engine, w).t())\n")
_W = "        self.weights = DeviceWeights(model, dev)\n"
ACCURACY_DRIFT = ("runtime/triton/engine.py", _W,
                  _W + "        _g = torch.Generator().manual_seed(0)  # planted: output norm weights drift\n"
                  "        _w = self.weights.vec[\"output_norm.weight\"]\n"
                  "        _w.mul_(1 + 0.25 * torch.randn(_w.shape, generator=_g).to(_w.device))\n")

CASES = {  # name: (base branch, head branch, expected verdicts)
    "aa": ("main", "main", {"none"}),
    "decode_slow": ("main", "decode-slow", {"REJECT"}),
    "prefill_slow": ("main", "prefill-slow", {"REJECT"}),
    "accuracy_drift": ("main", "accuracy-drift", {"REJECT"}),
    # The head is a child of its base: the worker measures a head merged with its base where it does not contain
    # it (worker/checkout.py), and `main` merged with `slow-base` would be slow-base itself.
    "speedup": ("slow-base", "speed-fix", {"S", "M", "L", "XL"}),
}


def _plant(repo: Path, file: str, old: str, new: str) -> None:
    p = repo / file
    text = p.read_text()
    if text.count(old) != 1:
        raise RuntimeError(f"{file}: the text to plant into occurs {text.count(old)} times, not once")
    p.write_text(text.replace(old, new))


def _branch(repo: Path, name: str, plants: list[tuple[str, str, str]], extra=None, start: str = "main") -> None:
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-b", name, start], check=True)
    for f, old, new in plants:
        _plant(repo, f, old, new)
    if extra:
        extra(repo)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "-am", f"planted: {name}"], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "main"], check=True)


def make_planted_repo(dest: Path) -> Path:
    """A clone of this checkout whose main is the working tree as it is (bench/tree_snapshot.py: the very
    commit `bench/worker/gpu_calibration.py` calibrates on the box, so main's runtime tree is the one the
    A/A history was recorded on), with one branch per planted change. Kept when it exists (a resumed run)."""
    from bench.tree_snapshot import REF, snapshot_commit

    repo = dest / "tokengate-e2e"
    if (repo / ".git").exists():
        return repo
    main = snapshot_commit(REPO)
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "fetch", "-q", str(REPO), f"+{REF}:refs/heads/snapshot"], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-B", "main", main], check=True)
    _branch(repo, "decode-slow", [DECODE_SLOW])
    _branch(repo, "slow-base", [DECODE_SLOW])
    file, old, new = DECODE_SLOW
    _branch(repo, "speed-fix", [(file, new, old)], start="slow-base")  # the slowdown taken out again
    _branch(repo, "prefill-slow", [PREFILL_SLOW],
            extra=lambda r: (r / "runtime/triton/prefill.py").write_text(
                (r / "runtime/triton/prefill.py").read_text() + PREFILL_HELPER))
    _branch(repo, "accuracy-drift", [ACCURACY_DRIFT])
    return repo


# -- services on the box ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(binary: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=open(workdir / "redis.log", "wb"), stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.exceptions.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server did not answer on {url}: {(workdir / 'redis.log').read_text()[-500:]}")


WORKER_SRC = """
import json, sys, time
from worker.queue.app import configure, app
from worker import pipeline
configure(sys.argv[1])
import worker.queue.tasks  # registers tokengate.evaluate

_clock = pipeline.Evaluation._clock_phase


def _logged(self, event, info):  # each phase as it starts, so a case cut short still says where it was
    _clock(self, event, info)
    if event != "step":
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"eval_id": self.eval_id, "phase": event, "model": info.get("model"),
                                "pair": info.get("pair"), "t": time.time()}) + "\\n")


pipeline.Evaluation._clock_phase = _logged
app.worker_main(["worker", "-Q", "gpu", "-P", "solo", "-c", "1", "--loglevel", "INFO", "-n", "gpu0@e2e"])
"""


def start_worker(url: str, workdir: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER_SRC, url, str(workdir / "phases.jsonl")], cwd=REPO, env=env,
                            stdout=open(workdir / "celery-worker.log", "wb"), stderr=subprocess.STDOUT)


# -- models and the load probe ----------------------------------------------------------------
def make_models(profile, device: str) -> list[dict]:
    """Each synthetic model once for this worker (the cache the pipeline reads), timed."""
    from worker import models as model_files

    out = []
    for spec in profile.models:
        path = model_files.synth_path(spec.synth)
        t = time.monotonic()
        made = not path.exists()
        if made:
            model_files.make_synth(spec.synth, REPO, device=device)
        secs = time.monotonic() - t
        t = time.monotonic()
        sha = model_files.sha256_file(path)
        out.append({"model": spec.name, "path": str(path), "bytes": path.stat().st_size, "sha256": sha,
                    "made_here": made, "synth_s": round(secs, 2), "sha256_s": round(time.monotonic() - t, 2),
                    "device": device})
    return out


PROBE_SRC = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch, runtime
t_import = time.perf_counter() - t0
path, max_ctx = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
with open(path, "rb") as f:
    while f.read(1 << 24):
        pass
t_read = time.perf_counter() - t
t = time.perf_counter()
eng = runtime.load_engine(path, device="cuda", max_context=max_ctx, backend="triton")
torch.cuda.synchronize()
t_load = time.perf_counter() - t
t = time.perf_counter()
eng.prefill(list(range(1, 257)))
eng.generate_greedy(16)
eng.synchronize()
t_first = time.perf_counter() - t
t = time.perf_counter()
eng.reset(); eng.prefill(list(range(1, 257))); eng.generate_greedy(16); eng.synchronize()
t_second = time.perf_counter() - t
d = os.environ["TRITON_CACHE_DIR"]
n = sum(len(fs) for _, _, fs in os.walk(d))
print(json.dumps({"import_s": t_import, "file_read_s": t_read, "load_engine_s": t_load,
                  "first_prefill256_gen16_s": t_first, "second_prefill256_gen16_s": t_second,
                  "triton_cache_files": n, "peak_gpu_bytes": torch.cuda.max_memory_allocated()}))
"""


def load_probe(model_path: str, max_context: int, workdir: Path) -> dict:
    """A fresh process loads the model with an empty Triton cache, then another with the filled one."""
    cache = workdir / "probe-triton"
    shutil.rmtree(cache, ignore_errors=True)
    out = {"model_path": model_path, "max_context": max_context}
    for run in ("cold_cache", "warm_cache"):
        env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
        t = time.monotonic()
        p = subprocess.run([sys.executable, "-c", PROBE_SRC, model_path, str(max_context)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
        wall = time.monotonic() - t
        if p.returncode != 0:
            out[run] = {"value": None, "reason": p.stderr[-1500:]}
            continue
        out[run] = {**json.loads(p.stdout.strip().splitlines()[-1]), "process_wall_s": wall}
    return out


# -- one case through Celery ------------------------------------------------------------------
def gate_noise(receipt: dict) -> dict:
    """Per model and gate: each process pair's log-ratio delta and the samples' relative spread."""
    out = {}
    for model, m in (receipt.get("models") or {}).items():
        for gate, nf in (m.get("noise_floors") or {}).items():
            samples = {r: [x for pair in m.get("samples_tok_s", {}).get(f"{r}/{gate}", []) for x in pair]
                       for r in ("base", "head")}
            out[f"{model}/{gate}"] = {
                "pair_deltas": nf.get("pair_deltas"), "floor": nf.get("floor"),
                "calibrated": nf.get("calibrated"),
                **{f"{r}_median": statistics.median(v) if v else None for r, v in samples.items()},
                **{f"{r}_spread": ((max(v) - min(v)) / statistics.median(v)) if len(v) > 1 else None
                   for r, v in samples.items()},
                **{f"{r}_n": len(v) for r, v in samples.items()},
            }
    return out


def gate_row(g: dict, receipt: dict) -> dict:
    """One gate's timing verdict with its memory gate beside it (the pipeline keeps peaks per model)."""
    model = (receipt.get("models") or {}).get(g.get("model")) or {}
    mem = (model.get("gate_memory") or {}).get(g.get("gate")) or {}
    return {**{k: g.get(k) for k in ("model", "gate", "base_median", "head_median", "rel_change", "ci_low", "ci_high",
                                     "noise_floor", "significant", "regression", "n_pairs")},
            "base_peak_gpu_bytes": mem.get("base_peak_gpu_bytes"), "head_peak_gpu_bytes": mem.get("head_peak_gpu_bytes"),
            "memory_regression": mem.get("regression"), "memory_reason": mem.get("reason")}


def phase_seconds(receipt: dict) -> list[dict]:
    return receipt.get("phases") or []


def phases_log(out: Path, eval_prefix: str) -> list[dict]:
    """The phases the worker started for one case (seconds = until the next one), from phases.jsonl."""
    try:
        rows = [json.loads(x) for x in (out / "phases.jsonl").read_text().splitlines() if x.strip()]
    except OSError:
        return []
    rows = [r for r in rows if str(r.get("eval_id", "")).startswith(eval_prefix)]
    for a, b in zip(rows, rows[1:]):
        a["seconds"] = round(b["t"] - a["t"], 2)
    return rows


def owes_upkeep(result: dict) -> bool:
    """Whether the worker takes A/A sentinel pairs after this verdict: some model owes one, and the verdict is not
    INFRA (an INFRA box's pairs are dropped, worker/calibration/sentinel.py `forgive`)."""
    models = (result.get("receipt") or {}).get("models") or {}
    return result.get("verdict") != "INFRA" and any(
        (m.get("sentinel_aa_pair") or {}).get("recorded", False) is None for m in models.values())


def upkeep_log(out: Path, eval_id: str, timeout: float, poll: float = 1.0) -> dict:
    """The upkeep the worker takes after a verdict (its A/A sentinel pairs, worker/calibration/sentinel.py), from
    phases.jsonl: waited for, so that the next case starts on an idle worker, and timed from the verdict's `done`
    to the upkeep's."""
    t_end = time.monotonic() + timeout
    while True:
        rows = [r for r in phases_log(out, eval_id) if r.get("eval_id") == eval_id]
        dones = [i for i, r in enumerate(rows) if r["phase"] == "done"]
        if len(dones) >= 2:
            return {"seconds": round(rows[dones[1]]["t"] - rows[dones[0]]["t"], 1),
                    "phases": rows[dones[0] + 1:dones[1]]}
        if time.monotonic() >= t_end:
            return {"seconds": None, "reason": f"the upkeep did not end within {timeout:.0f} s of the verdict",
                    "phases": rows[dones[0] + 1:] if dones else []}
        time.sleep(poll)


# The speedup case's base is a planted branch, not main: its runtime tree differs from the A/A history's by
# the plant alone, and the worker would first record drift_window A/A pairs of it (worker/calibration/
# runtime_change.py; ~7 min of 9B pairs). Off for that case only, and the case says so.
NOT_MAIN_BASE = {"speedup"}


def run_case(app, name: str, repo: Path, settings, profile: str, n: int, timeout: float, out: Path) -> dict:
    base, head, expected = CASES[name]
    note = None
    if name in NOT_MAIN_BASE:
        settings = settings.model_copy(update={"runtime_check": False})
        note = (f"base {base!r} is a planted branch of main: the runtime check after a change of main's runtime "
                "is off for this case (runtime_check=False)")
    job = {"repo": str(repo), "base_ref": base, "head_ref": head, "repo_full_name": "tokengate/e2e",
           "pr_number": 1000 + n, "profile": profile, "eval_id": f"e2e-{name}-{int(time.time())}",
           "settings": settings.model_dump(mode="json")}
    t = time.monotonic()
    res = app.send_task("tokengate.evaluate", args=[job], queue="gpu").get(timeout=timeout)
    wall = time.monotonic() - t
    rec = res.get("receipt") or {}
    upkeep = upkeep_log(out, job["eval_id"], max(1.0, timeout - wall)) if owes_upkeep(res) else None
    return {
        "case": name, "base": base, "head": head, "expected": sorted(expected), "verdict": res["verdict"], "note": note,
        "ok": res["verdict"] in expected, "summary": res.get("summary"), "task_wall_s": round(wall, 1),
        "upkeep_after_verdict": upkeep,
        "duration_s": res.get("duration_s"), "phases": phase_seconds(rec),
        "infra_kind": res.get("infra_kind"), "infra_detail": res.get("infra_detail"),
        "gates": [gate_row(g, rec) for g in res.get("gates") or []],
        "guards": res.get("guards"), "noise": gate_noise(rec),
        "models": {k: {"gguf_sha256": v.get("gguf_sha256"), "process_pairs": v.get("process_pairs"),
                       "gate_memory": v.get("gate_memory"), "gates_not_measured": v.get("gates_not_measured"),
                       "outputs_partly_verified": v.get("outputs_partly_verified"),
                       "gates_not_confirmed": v.get("gates_not_confirmed")}
                   for k, v in (rec.get("models") or {}).items()},
        "models_not_measured": rec.get("models_not_measured"),
        "load_seconds": {r: (p.get("hello") or {}).get("load_seconds") for r, p in (rec.get("processes") or {}).items()},
        "op_seconds": {r: p.get("op_seconds") for r, p in (rec.get("processes") or {}).items()},
        "pair_load_seconds": rec.get("pair_load_seconds"),
        "peak_gpu_memory_bytes": {**{r: p.get("peak_gpu_memory_bytes") for r, p in (rec.get("processes") or {}).items()},
                                  "worker": rec.get("worker_peak_gpu_memory_bytes")},
        "isolation": rec.get("isolation"), "host": rec.get("host"),
    }


def resume(receipt: dict, path: Path, profile: str) -> set[str]:
    """Fold an earlier piece's receipt (same box, same --state) into this one: its cases with a verdict
    stay and are not run again; a case it cut off is kept under `cut_off` and runs again. Returns the
    cases done."""
    if not path.exists():
        return set()
    prior = json.loads(path.read_text())
    uuid = (receipt["host"].get("gpu") or {}).get("uuid")
    if prior.get("profile") != profile or ((prior.get("host") or {}).get("gpu") or {}).get("uuid") != uuid:
        raise SystemExit(f"{path}: an earlier run of another profile or GPU; use a fresh --state")
    done = [c for c in prior.get("cases", []) if c.get("verdict") is not None]
    receipt["cases"] = done
    receipt["cut_off"] = prior.get("cut_off", []) + [c for c in prior.get("cases", []) if c.get("verdict") is None]
    receipt["earlier_pieces"] = prior.get("earlier_pieces", []) + [
        {k: prior.get(k) for k in ("created", "commit", "steps", "skipped", "wall_s")}]
    return {c["case"] for c in done}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="standard")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting cases past this wall time")
    ap.add_argument("--case-estimate-s", type=float, default=150.0, help="skip a case when less than this is left")
    ap.add_argument("--max-pairs", type=int, default=None, help="override the profile's max_process_pairs")
    ap.add_argument("--probe", action="store_true", help="time a fresh load with an empty / a filled Triton cache")
    ap.add_argument("--probe-role", default="primary", choices=("primary", "guard"), help="the model --probe loads")
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--commit", default=os.environ.get("TOKENGATE_COMMIT"), help="tokengate commit under test")
    ap.add_argument("--state", default=None,
                    help="keep the repository, models and receipt here and resume from them: a later call on the same "
                         "box runs only the cases without a verdict yet (one receipt over the pieces)")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="tokengate-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.setdefault("TOKENGATE_CACHE_DIR", str(work / "cache")))  # the worker's volume
    sys.path.insert(0, str(REPO))
    from bench.tree_snapshot import tree_facts
    from worker import telemetry
    from worker.config import EvalSettings
    from worker.queue.app import configure

    settings = EvalSettings(profile=args.profile, retries=0)
    if args.max_pairs:
        settings = settings.with_profile(args.profile, max_process_pairs=args.max_pairs)
    prof = settings.profile_settings(args.profile)
    tree = tree_facts(REPO)
    receipt = {"kind": "gpu_e2e", "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               **tree, "commit": args.commit or tree.get("git_commit"), "profile": args.profile,
               "config": prof.model_dump(mode="json"),
               "eval_settings": settings.model_dump(mode="json", exclude={"profiles"}),
               "host": telemetry.host_facts(args.device), "budget_s": args.budget_s, "steps": {}, "cases": [],
               "skipped": []}
    resumed = resume(receipt, work / "gpu-e2e.json", args.profile) if args.state else None
    todo = [c for c in args.cases.split(",") if c and c not in (resumed or set())]

    def save():
        receipt["wall_s"] = round(time.monotonic() - t_start, 1)
        for path in (out / "gpu-e2e.json", work / "gpu-e2e.json"):
            path.write_text(json.dumps(receipt, indent=1, default=str))

    def step(name, fn):
        t = time.monotonic()
        try:
            receipt["steps"][name] = {"result": fn()}
        except Exception as exc:  # noqa: BLE001 - recorded, the receipt says what broke
            receipt["steps"][name] = {"result": None, "reason": f"{type(exc).__name__}: {exc}"}
        receipt["steps"][name]["seconds"] = round(time.monotonic() - t, 2)
        save()
        print(f"[e2e] {name}: {receipt['steps'][name]['seconds']} s", flush=True)
        return receipt["steps"][name]["result"]

    redis_proc = worker = None
    try:
        repo = step("planted_repo", lambda: str(make_planted_repo(work)))
        models = step("models", lambda: make_models(prof, args.device))
        if args.probe and models:
            name = next(s.name for s in prof.models if s.role == args.probe_role)
            probed = next(m for m in models if m["model"] == name)
            step("load_probe", lambda: {"model": name, **load_probe(probed["path"], 4096, work)})
        r = step("redis", lambda: start_redis(args.redis_server, out))
        if r is None or repo is None:
            return 1
        redis_proc, url = r
        env = {**os.environ, "TOKENGATE_DEVICE": args.device, "TOKENGATE_TRUSTED_RUNTIME": str(REPO),
               "TOKENGATE_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
        worker = start_worker(url, out, env)
        app = configure(url)
        for name in todo:
            i = list(CASES).index(name)
            left = args.budget_s - (time.monotonic() - t_start)
            if left < args.case_estimate_s:
                receipt["skipped"].append({"case": name, "reason": f"{left:.0f} s of the {args.budget_s:.0f} s budget "
                                                                   f"left, a case needs ~{args.case_estimate_s:.0f} s"})
                save()
                continue
            t = time.monotonic()
            try:
                receipt["cases"].append(run_case(app, name, Path(repo), settings, args.profile, i, timeout=left,
                                                 out=out))
            except Exception as exc:  # noqa: BLE001
                receipt["cases"].append({"case": name, "verdict": None, "ok": False,
                                         "reason": f"{type(exc).__name__}: {exc}",
                                         "phases_started": phases_log(out, f"e2e-{name}-")})
            c = receipt["cases"][-1]
            print(f"[e2e] {name}: {c.get('verdict')} (expected {c.get('expected')}) in {c.get('task_wall_s')} s; upkeep "
                  f"after it {(c.get('upkeep_after_verdict') or {}).get('seconds')} s; {time.monotonic() - t:.0f} s in all",
                  flush=True)
            save()
    finally:
        for p in (worker, redis_proc):
            if p is not None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        wanted = {c for c in args.cases.split(",") if c}
        receipt["all_ok"] = wanted <= {c["case"] for c in receipt["cases"]} and all(
            c.get("ok") for c in receipt["cases"]) and not receipt["skipped"]
        save()
    return 0 if receipt["all_ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
