"""`tokengate eval`, `tokengate demo`, `tokengate calibrate`: the pipeline in-process, embedded defaults.

The bot's argparse dispatcher (bot/cli.py) calls `add_arguments_*` and the `*_command(args)`
functions here; each returns the process exit status: 0 a verdict on the PR that is not a
failure (a tier or none), 1 REJECT / BUILD_FAILED / mixed, 3 INFRA, 4 uncalibrated / withheld. `tokengate demo` is the exception: it exits 0
when its planted slowdown was rejected (its job) and 2, saying why, when it was not.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from worker.calibration.aa_store import AAStore
from worker.config import EvalSettings
from worker.paths import cache_dir
from worker.pipeline import Evaluation, Job, evaluate_with_retries
from worker.records import EvalResult, Verdict
from worker.report import comment_markdown, verdict_table

EXIT = {Verdict.REJECT: 1, Verdict.BUILD_FAILED: 1, Verdict.MIXED: 1, Verdict.INFRA: 3,
        Verdict.UNCALIBRATED: 4, Verdict.WITHHELD: 4}  # 4: no verdict on the PR yet (no pass)
DEMO_FAILED = 2  # `tokengate demo` could not show the planted slowdown rejected

# The demo PR's real change: decode does its work twice (same outputs, half the speed).
DEMO_SLOWER_PATCH = '''

# --- tokengate demo PR: a deliberately slower decode path -------------------------------------
# Every decode step is computed twice (state restored in between), so outputs are unchanged and
# decode speed halves. `tokengate demo` evaluates this branch against its base.
_demo_fast_decode = ReferenceEngine.decode


def _demo_decode_twice(self, token_id):
    snap = self.snapshot()
    _demo_fast_decode(self, token_id)
    self.restore(snap)
    return _demo_fast_decode(self, token_id)


ReferenceEngine.decode = _demo_decode_twice
'''


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="quick", help="quick (CPU, tiny models) | standard | full")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: the profile's)")
    p.add_argument("--models", default=None, help="comma-separated model names of the profile")
    p.add_argument("--out", default=None, help="directory for comment.md and receipt.json")
    p.add_argument("--retries", type=int, default=None, help="INFRA retries (default from settings)")


def add_arguments_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", required=True, help="path or URL of the runtime repository")
    p.add_argument("--base", required=True, help="base ref or SHA")
    p.add_argument("--head", required=True, help="head ref or SHA")
    add_common(p)


def add_arguments_demo(p: argparse.ArgumentParser) -> None:
    add_common(p)


def add_arguments_calibrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", default=None, help="repository (default: this one)")
    p.add_argument("--ref", default="HEAD", help="the revision measured against itself")
    p.add_argument("--runs", type=int, default=20,
                   help="A/A evaluations to record (each adds its first process pair's delta per gate; the quick "
                        "profile's 4 gates need 16 for the default false-significance rate)")
    add_common(p)


# -- helpers -------------------------------------------------------------------------------------
def _settings(args) -> EvalSettings:
    s = EvalSettings(profile=args.profile)
    if getattr(args, "retries", None) is not None:
        s = s.model_copy(update={"retries": args.retries})
    s.profile_settings(args.profile)  # unknown profile → ValueError now, not mid-run
    return s


def _models(args) -> list[str] | None:
    return [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None


class _Progress:
    """Turns pipeline events into a rich progress display."""

    def __init__(self, console):
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                          console=console, transient=True)
        self.task = None

    def __enter__(self):
        self.p.__enter__()
        self.task = self.p.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        self.p.__exit__(*exc)

    def __call__(self, event: str, **info):
        model = info.get("model", "")
        if event == "gates":
            self.p.update(self.task, description=f"{model}: timing gates (ABBA)", total=info["total"], completed=0)
        elif event == "step":
            self.p.advance(self.task)
        else:
            words = {"checkout": "checking out base and head", "models": "preparing models",
                     "start": "starting sandboxed revisions", "load": f"{model}: loading",
                     "accuracy": f"{model}: accuracy guards", "verify": f"{model}: checking outputs",
                     "confirm": f"{model}: confirming on a fresh process pair",
                     "sentinel": f"{model}: A/A sentinel pair (calibration upkeep)",
                     "model": f"{model}", "done": "done"}
            self.p.update(self.task, description=words.get(event, event), total=None)


def _report(result: EvalResult, out_dir: Path | None, console) -> Path:
    out = Path(out_dir) if out_dir else Path.cwd() / f"tokengate-{(result.head_sha or 'unknown')[:10]}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "comment.md").write_text(comment_markdown(result))
    (out / "receipt.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    console.print(verdict_table(result))
    console.print(f"wrote {out / 'comment.md'} and {out / 'receipt.json'} ({result.duration_s:.0f} s)")
    return out


def run_eval(job: Job, settings: EvalSettings, out_dir, console, **kw) -> EvalResult:
    with _Progress(console) as progress:
        result = evaluate_with_retries(job, settings, progress=progress, **kw)
    _report(result, out_dir, console)
    return result


# -- commands ------------------------------------------------------------------------------------
def _console():
    from rich.console import Console

    # Piped output (CI logs) gets a table wide enough to read, not rich's 80-column default.
    return Console() if sys.stdout.isatty() else Console(width=150)


def eval_command(args, *, console=None, settings: EvalSettings | None = None, **eval_kw) -> int:
    console = console or _console()
    job = Job(repo=args.repo, base_ref=args.base, head_ref=args.head, profile=args.profile,
              models=_models(args), device=args.device)
    result = run_eval(job, settings or _settings(args), args.out, console, **eval_kw)
    return EXIT.get(result.verdict, 0)


def source_tree() -> Path:
    """This repository: the git checkout the code runs from (or the installed package tree)."""
    here = Path(__file__).resolve().parent.parent
    return here


def make_demo_repo(dest: Path) -> tuple[Path, str, str]:
    """A throwaway clone of this repository with a `demo-pr` branch carrying a real slowdown."""
    src = source_tree()
    repo = dest / "tokengate-demo"
    git = ["git", "-c", "user.name=tokengate demo", "-c", "user.email=demo@tokengate.invalid"]
    top = subprocess.run(["git", "-C", str(src), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode == 0 and Path(top.stdout.strip()).resolve() == src:
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(src), str(repo)], check=True)
        # Carry uncommitted work too, so the demo measures the code as it is on disk.
        subprocess.run(["git", "-C", str(src), "diff", "HEAD", "--binary", "--output", str(dest / "wip.patch")],
                       check=True)
        if (dest / "wip.patch").stat().st_size:
            subprocess.run(["git", "-C", str(repo), "apply", str(dest / "wip.patch")], check=True)
    else:  # an installed package, not a checkout: copy its tree into a fresh repository
        repo.mkdir(parents=True)
        for name in ("runtime", "worker", "bot", "pyproject.toml", "README.md"):
            s = src / name
            if s.is_dir():
                shutil.copytree(s, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif s.exists():
                shutil.copy(s, repo / name)
        subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "demo base"], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-b", "demo-pr"], check=True)
    engine = repo / "runtime" / "engine.py"
    if "class ReferenceEngine" not in engine.read_text():
        raise RuntimeError(f"{engine} has no ReferenceEngine to slow down")
    engine.write_text(engine.read_text() + DEMO_SLOWER_PATCH)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-am", "demo PR: decode does its work twice"],
                   check=True)
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD~1"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return repo, base, "demo-pr"


def demo_command(args, *, console=None) -> int:
    console = console or _console()
    with tempfile.TemporaryDirectory(prefix="tokengate-demo-") as tmp:
        repo, base, head = make_demo_repo(Path(tmp))
        console.print(f"demo repository {repo}: branch [bold]{head}[/] makes every decode step do its work "
                      "twice (a real 2x decode slowdown, outputs unchanged)")
        job = Job(repo=str(repo), base_ref=base, head_ref=head, profile=args.profile, models=_models(args),
                  device=args.device)
        result = run_eval(job, _demo_settings(args, console), args.out or Path.cwd() / "tokengate-demo", console)
    ok, why = demo_outcome(result)
    if not ok:
        console.print(f"[bold red]demo failed:[/] {why}")
    return 0 if ok else DEMO_FAILED


def _demo_settings(args, console) -> EvalSettings:
    """The demo's settings. Its two revisions are this package's own throwaway branch, not a PR's code: on a host
    without the full sandbox (a fresh machine often lacks bubblewrap) it runs them under the layers that work and
    says so, where a PR's evaluation is INFRA `sandbox_unavailable` (the override is never on for those)."""
    from worker.sandbox import detect_isolation
    settings, iso = _settings(args), detect_isolation()
    if iso.full:
        return settings
    console.print(f"[yellow]this host lacks the full sandbox[/] ({iso.reason}): the demo runs its own throwaway "
                  "branch under the layers that work (DEVELOPMENT OVERRIDE). A pull request's code never runs like "
                  "this: every evaluation here would be INFRA sandbox_unavailable until the full sandbox works "
                  "(README, Security).")
    return settings.model_copy(update={"sandbox_dev_override": True})


def demo_outcome(result: EvalResult) -> tuple[bool, str]:
    """Did the demo do its job? Its PR doubles the decode work, so the verdict must be REJECT and name a
    decode gate as the regression; anything else (a pass, a tier, INFRA, a REJECT for another reason)
    means the demo could not show what it exists to show."""
    if result.verdict != Verdict.REJECT:
        return False, f"expected REJECT for the planted 2x decode slowdown, got {result.verdict.value}: {result.summary}"
    decode = [g.gate for g in result.gates if g.regression and g.gate.startswith("decode")]
    if not decode:
        return False, f"REJECT without a decode-gate regression ({result.summary}): not the planted slowdown"
    return True, f"the planted slowdown was rejected on {', '.join(decode)}"


def calibrate(repo: str, ref: str, settings: EvalSettings, *, runs: int, models: list[str] | None = None,
              device: str | None = None, store: AAStore | None = None, progress=None, **kw) -> dict:
    """Run `runs` A/A evaluations of `ref` against itself; record deltas; return the floors."""
    store = store or AAStore()
    done = []
    for i in range(runs):
        job = Job(repo=repo, base_ref=ref, head_ref=ref, profile=settings.profile, models=models, device=device)
        ev = Evaluation(job, settings, store=store, record_aa=True, progress=progress, **kw)
        r = ev.run()
        ev.upkeep()
        if r.verdict == Verdict.INFRA:
            raise RuntimeError(f"A/A run {i + 1} could not measure: {r.summary}")
        done.append(r)
    host = ev.host
    floors = {}
    for spec in ev.profile.models:
        nulls = ev._nulls(spec.name, spec.gate_names())
        for gate in spec.gate_names():
            deltas = store.pair_deltas(host, settings.profile, ev.protocol_key(spec.name), spec.name, gate)
            null = nulls[gate]
            floors[f"{spec.name} {gate}"] = {
                "n": len(deltas), "floor": null.floor if null.calibrated else None, "pairs": null.pairs,
                "bound": null.bound, "max_abs_delta": math.expm1(max(abs(d) for d in deltas)) if deltas else None}
    return {"host": host, "runs": len(done),
            "floors": floors, "store": str(store.path)}


def calibrate_command(args, *, console=None) -> int:
    from rich.table import Table

    console = console or _console()
    settings = _settings(args)
    repo = args.repo or str(source_tree())
    t0 = time.monotonic()
    with _Progress(console) as progress:
        summary = calibrate(repo, args.ref, settings, runs=args.runs, models=_models(args), device=args.device,
                            progress=progress)
    t = Table(title=f"A/A noise on {summary['host']} ({summary['runs']} runs, {time.monotonic() - t0:.0f} s)")
    for c in ("gate", "A/A pair deltas", "max |delta|", "noise floor", "pairs that must agree", "P(false) per gate"):
        t.add_column(c)
    for gate, f in summary["floors"].items():
        t.add_row(gate, str(f["n"]), f"{100 * f['max_abs_delta']:.1f}%" if f["max_abs_delta"] is not None else "n/a",
                  f"{100 * f['floor']:.1f}%" if f["floor"] is not None else "n/a (too few)", str(f["pairs"]),
                  f"{f['bound']:.1e}" if f["bound"] is not None else "no guarantee")
    console.print(t)
    console.print(f"recorded in {summary['store']}")
    out = Path(args.out) if args.out else cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(summary, indent=2))
    return 0


def _delegated(add_arguments, command, prog: str):
    def entry(argv: list[str] | None = None) -> int:
        ap = argparse.ArgumentParser(prog=f"tokengate {prog}")
        add_arguments(ap)
        args = ap.parse_args(argv)
        try:
            return command(args)
        except ValueError as exc:  # bad input: say it plainly
            print(f"tokengate {prog}: {exc}", file=sys.stderr)
            return 2
    return entry


# Entry points the bot's dispatcher (bot/cli.py DELEGATED) calls with the remaining argv.
eval_main = _delegated(add_arguments_eval, eval_command, "eval")
demo_main = _delegated(add_arguments_demo, demo_command, "demo")
calibrate_main = _delegated(add_arguments_calibrate, calibrate_command, "calibrate")


def main(argv=None) -> int:
    """Stand-alone entry (`python -m worker.cli eval ...`), same commands as `tokengate`."""
    ap = argparse.ArgumentParser(prog="tokengate")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_arguments_eval(sub.add_parser("eval", help="evaluate head against base"))
    add_arguments_demo(sub.add_parser("demo", help="evaluate a throwaway PR branch of this repository"))
    add_arguments_calibrate(sub.add_parser("calibrate", help="A/A runs: record each gate's noise"))
    args = ap.parse_args(argv)
    return {"eval": eval_command, "demo": demo_command, "calibrate": calibrate_command}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
