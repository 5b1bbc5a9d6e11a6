"""Render an EvalResult: comment markdown (Jinja2 template) and a rich verdict table for the terminal."""
from __future__ import annotations

from pathlib import Path

import jinja2

from worker import safe_text
from worker.records import EvalResult, GateResult

# All wording lives in the top-level templates/ folder (the bot renders its GitHub text from there too).
_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def _pct(x, sign=True):
    if x is None:
        return "n/a"
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def _num(x):
    return "n/a" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.3g}")


def _sci(x):
    return "n/a" if x is None else f"{x:.2g}"


def _floors(g: GateResult) -> str:
    """Both one-sided floors; the larger as ± for results stored before there were two."""
    if g.floor_slower is None or g.floor_faster is None:
        return "±" + _pct(g.noise_floor, False)
    return f"−{_pct(g.floor_slower, False)} / +{_pct(g.floor_faster, False)}"


def gate_word(g: GateResult) -> str:
    if g.regression:
        return "**REGRESSION**"
    if g.significant and (g.rel_change or 0) > 0:
        return "faster"
    if g.not_confirmed:
        return "slower, not confirmed"
    return "within noise"


def comment_markdown(result: EvalResult) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(safe_text.FILTERS)  # PR-derived text is escaped in the templates (| md, | codeblock)
    rc = result.receipt or {}
    iso = rc.get("isolation", {})
    iso_text = iso.get("method", "?") + ("" if iso.get("network_isolated", False) else " (NOT network-isolated)")
    gpu = rc.get("host", {}).get("gpu", {}).get("name")
    device = gpu.get("value") if isinstance(gpu, dict) else gpu
    clock = {"oncpu": "on-CPU time of the revision's process", "wall": "wall clock"}.get(
        rc.get("config", {}).get("profile", {}).get("clock", "wall"), "wall clock")
    d = result.to_dict()
    return env.get_template("eval_report.md.j2").render(
        r=d, pct=_pct, num=_num, sci=_sci, gate_word=lambda g: gate_word(GateResult(**g)),
        device=device or rc.get("host", {}).get("cpu_model") or "cpu", clock=clock,
        harness=rc.get("harness_version", "?"), isolation=iso_text, eval_id=rc.get("eval_id", "?"))


def verdict_table(result: EvalResult):
    """A rich renderable: gates and guards of one evaluation."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    style = {"REJECT": "bold red", "INFRA": "bold yellow", "BUILD_FAILED": "bold red", "mixed": "bold red",
             "uncalibrated": "bold yellow", "withheld": "bold yellow"}.get(result.verdict.value, "bold green")
    parts = [Text(f"verdict: {result.verdict.value}", style=style), Text(result.summary)]
    if result.gates:
        t = Table(title="speed gates (tok/s)")
        for c in ("model", "gate", "base", "head", "change", "95% interval (pairs)", "floors (slower / faster)", ""):
            t.add_column(c, justify="right" if c in ("base", "head", "change", "floors (slower / faster)") else "left")
        for g in result.gates:
            word = gate_word(g)
            t.add_row(g.model, g.gate + (" ★" if g.scored else ""), _num(g.base_median), _num(g.head_median),
                      _pct(g.rel_change), f"{_pct(g.ci_low)} … {_pct(g.ci_high)}", _floors(g),
                      Text(word.strip("*"), style="red" if g.regression else ("green" if word == "faster" else "")))
        parts.append(t)
    if result.guards:
        t = Table(title="accuracy guards (vs pinned fp32 reference)")
        for c in ("model", "head top-1", "base top-1", "Δ paired", "head KL", "result"):
            t.add_column(c)
        for g in result.guards:
            res = ("pass" if g.passed else f"FAIL: {g.reason}") + (" (bit-identical)" if g.bit_identical else "")
            t.add_row(g.model, _pct(g.head_top1, False), _pct(g.base_top1, False), _pct(g.paired_delta),
                      _sci(g.head_kl), Text(res, style="green" if g.passed else "red"))
        parts.append(t)
    for n in result.notes:
        parts.append(Text(f"note: {n}", style="yellow"))
    if result.infra_detail and (result.verdict.value in ("INFRA", "BUILD_FAILED") or result.failure):
        parts.append(Text(result.infra_detail, style="yellow"))
    return Group(*parts)
