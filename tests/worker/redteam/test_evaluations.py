"""Hostile revisions through the whole pipeline: each gets the verdict it must get, and nothing leaks.

The attacks need the full sandbox (marked `sandbox`: skipped without it, FAILED where it is required); fail-closed
INFRA sandbox_unavailable without it is `test_without_the_full_sandbox_the_evaluation_is_infra`.
"""
import hashlib
import os
import re
import socket
import time
import uuid

import psutil
import pytest

from tests.conftest import service_down

from worker.records import InfraKind, Verdict

from tests.worker.helpers import GOOD
from .conftest import assert_postgres_untouched, run_eval

pytestmark = pytest.mark.timed  # whole evaluations: speed gates and request deadlines

TIERS = {Verdict.S, Verdict.M, Verdict.L, Verdict.XL}


def text(r) -> str:
    return f"{r.summary}\n{r.infra_detail or ''}\n{r.build_log_tail or ''}"


def _tree_digest(root) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.sandbox
@pytest.mark.services("Redis")  # and PostgreSQL where it runs (not on the GPU box)
def test_exfiltration_gets_nothing(tmp_path, monkeypatch):
    import redis

    marker = "tg_redteam_" + uuid.uuid4().hex[:10]
    monkeypatch.setenv("TOKENGATE_GITHUB_TOKEN", "ghs_exfil_secret_value")
    monkeypatch.setenv("TOKENGATE_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    secret = tmp_path / "run" / "secrets" / "app_key.pem"
    secret.parent.mkdir(parents=True)
    secret.write_text("-----BEGIN RSA PRIVATE KEY----- exfil")
    settings = tmp_path / "tokengate.env"
    settings.write_text("TOKENGATE_WEBHOOK_SECRET=whsec_exfil")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.1)
    usock = tmp_path / "svc.sock"
    usrv = socket.socket(socket.AF_UNIX)
    usrv.bind(str(usock))
    usrv.listen(4)
    usrv.settimeout(0.1)
    host_file = tmp_path / "leaked.txt"
    target = {"secret": str(secret), "settings": str(settings), "port": srv.getsockname()[1], "unix": str(usock),
              "marker": marker, "host_file": str(host_file), "parent_pid": os.getpid(),
              "model": str(tmp_path / "m.gguf")}
    r = run_eval(tmp_path, "exfiltrate", target)
    assert r.verdict not in (Verdict.BUILD_FAILED, Verdict.INFRA), text(r)
    assert "LEAKED" not in text(r)
    # Nothing reached the host, whatever the verdict.
    for s in (srv, usrv):
        with pytest.raises(socket.timeout):
            s.accept()
    assert not host_file.exists()
    assert (tmp_path / "m.gguf").read_bytes().startswith(b"FAKEGGUF")
    assert redis.Redis(host="127.0.0.1").get(marker) is None
    if service_down("PostgreSQL") is None:
        assert_postgres_untouched(marker)


@pytest.mark.sandbox
def test_escapes_fail_and_trusted_code_is_untouched(tmp_path):
    trusted = tmp_path / "trusted_marker.py"
    trusted.write_text("# trusted\n")
    before = _tree_digest(GOOD)
    r = run_eval(tmp_path, "escape", {"trusted_file": str(GOOD / "runtime" / "__init__.py")})
    assert r.verdict not in (Verdict.BUILD_FAILED, Verdict.INFRA), text(r)
    assert trusted.read_text() == "# trusted\n" and _tree_digest(GOOD) == before


@pytest.mark.sandbox
def test_reserving_host_disk_past_the_file_size_limit_fails(tmp_path):
    """fallocate(KEEP_SIZE) of 3 GiB on its stderr log and in its compile cache (RLIMIT_FSIZE is 1 GiB): refused."""
    r = run_eval(tmp_path, "disk_fill")
    assert r.verdict not in (Verdict.BUILD_FAILED, Verdict.INFRA), text(r)
    assert "LEAKED" not in text(r)


@pytest.mark.sandbox
def test_fork_bomb_is_stopped_by_pids_max(tmp_path):
    t0 = time.monotonic()
    r = run_eval(tmp_path, "forkbomb")
    assert r.verdict is Verdict.BUILD_FAILED, text(r)
    n = int(text(r).split("fork bomb stopped after ")[1].split()[0])
    assert n < 256 and time.monotonic() - t0 < 120
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(tmp_path) in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.sandbox
def test_filling_tmp_stops_at_its_cap(tmp_path):
    avail = psutil.virtual_memory().available
    r = run_eval(tmp_path, "fill")
    assert r.verdict is Verdict.BUILD_FAILED, text(r)
    assert "filling /tmp stopped after" in text(r) and "No space left" in text(r)
    assert psutil.virtual_memory().available > avail - (1 << 30)  # tmpfs pages were freed with the sandbox


@pytest.mark.sandbox
def test_work_on_exited_threads_is_on_the_clock(tmp_path):
    """3x the decode work on a thread that exits before the answer: once XL +7234 %; now slower."""
    r = run_eval(tmp_path, "exited_thread", prefill_contexts=[], decode_contexts=[32])
    assert r.verdict not in TIERS, text(r)
    g = next(g for g in r.gates if g.gate == "decode@32")
    assert g.head_median < 0.6 * g.base_median, g


@pytest.mark.sandbox
def test_hogging_the_other_revision_does_not_pay(tmp_path):
    r = run_eval(tmp_path, "hog", clock="wall", pairs=4)
    assert r.verdict not in TIERS, text(r)


@pytest.mark.sandbox
def test_doing_less_work_when_not_asked_for_all_logits_is_caught(tmp_path):
    r = run_eval(tmp_path, "skip_work")
    assert r.verdict is Verdict.REJECT, text(r)
    assert "timed outputs differ from the reference" in r.summary
    assert all(g.passed for g in r.guards)  # the all-logits accuracy guard alone would have passed it


@pytest.mark.sandbox
def test_patching_the_driver_gains_nothing(tmp_path):
    r = run_eval(tmp_path, "patch_driver")
    assert r.verdict is Verdict.REJECT, text(r)
    assert "timed outputs differ from the reference" in r.summary


@pytest.mark.sandbox
def test_output_file_tricks_do_not_reach_the_parent(tmp_path):
    rss0 = psutil.Process().memory_info().rss
    t0 = time.monotonic()
    r = run_eval(tmp_path, "file_tricks")
    assert r.verdict not in (Verdict.BUILD_FAILED, Verdict.INFRA), text(r)
    assert time.monotonic() - t0 < 90
    assert psutil.Process().memory_info().rss - rss0 < (500 << 20)


@pytest.mark.sandbox
def test_comment_injection_is_escaped(tmp_path):
    from worker.report import comment_markdown

    r = run_eval(tmp_path, "inject")
    assert r.verdict is Verdict.BUILD_FAILED
    md = comment_markdown(r)
    first = md.strip().splitlines()[0]
    assert "BUILD_FAILED" in first
    assert "<!--" not in md
    # The log tail sits in ONE fenced block whose fence is longer than any backtick run in it.
    fence = re.search(r"^(`{3,})$", md, re.M).group(1)
    body, rest = md.split(fence + "\n", 1)[1].split("\n" + fence, 1)
    assert max(len(x) for x in re.findall(r"`+", body)) < len(fence) and fence not in rest
    outside = md.replace(body, "")
    assert "<img" not in outside and "@everyone" not in outside, outside
    assert not re.search(r"(?<!\\)\]\(javascript", outside)
    assert not any(line.startswith(("| decode@32", "## ✅")) for line in outside.splitlines())
    assert md.rstrip().endswith("</sub>")  # nothing swallowed the footer


def test_without_the_full_sandbox_the_evaluation_is_infra(tmp_path, monkeypatch):
    from worker.sandbox import probe

    weak = probe.Isolation("degraded: none", False, False, "test: bubblewrap missing")
    monkeypatch.setattr(probe, "detect_isolation", lambda: weak)
    import worker.pipeline as pl
    import worker.sandbox.process as sp
    monkeypatch.setattr(pl.sandbox, "detect_isolation", lambda: weak)
    monkeypatch.setattr(sp, "detect_isolation", lambda: weak)
    r = run_eval(tmp_path, "escape", {"trusted_file": str(tmp_path / "x")})
    assert r.verdict is Verdict.INFRA and r.infra_kind is InfraKind.SANDBOX_UNAVAILABLE
    assert "bubblewrap missing" in r.summary and not r.sandbox_override


def test_the_development_override_is_marked_and_never_merged(tmp_path, monkeypatch):
    from worker.sandbox import probe

    weak = probe.Isolation("degraded: none", False, False, "test: no cgroups")
    import worker.pipeline as pl
    import worker.sandbox.process as sp
    monkeypatch.setattr(pl.sandbox, "detect_isolation", lambda: weak)
    monkeypatch.setattr(sp, "detect_isolation", lambda: weak)
    r = run_eval(tmp_path, "escape", {"trusted_file": str(tmp_path / "x")}, settings_kw={"sandbox_dev_override": True})
    assert r.sandbox_override is True
    assert r.summary.startswith("DEVELOPMENT OVERRIDE") and "never merged" in r.summary
    assert r.to_dict()["sandbox_override"] is True  # what bot/rounds.py reads


@pytest.mark.sandbox
def test_filling_the_compile_cache_is_stopped_at_its_cap_and_wiped(tmp_path, monkeypatch, cache):
    """Files under RLIMIT_FSIZE, as many as it likes, in its compile cache (the one host directory it may write,
    kept after the evaluation): killed at the cap (lowered to 64 MiB here), the PR's fault, nothing left."""
    from worker import compile_cache
    from worker.sandbox.disk import usage
    monkeypatch.setattr(compile_cache, "MAX_BYTES_PER_REVISION", 64 << 20)
    r = run_eval(tmp_path, "cache_fill")
    assert r.verdict is Verdict.REJECT and r.infra_kind is None, text(r)
    assert "disk cap" in text(r), text(r)
    left = usage(compile_cache.compile_cache_dir(r.head_sha), 10**6)
    assert left.bytes < 1 << 20, left  # emptied after the kill


@pytest.mark.sandbox
def test_cheating_on_the_reps_that_are_not_verified_is_caught_in_every_timed_prefill(tmp_path, monkeypatch):
    """Decode outputs are verified on a drawn rep; a timed prefill is checked on every rep. The drawn rep (0) is
    the honest one here: checking timed prefills on the verified reps alone would pass this head."""
    from worker.pipeline import Evaluation

    monkeypatch.setattr(Evaluation, "_draw_verify_reps", lambda self: {0})
    r = run_eval(tmp_path, "skip_later_prefills", pairs=4, verify_reps=1)
    # every rep checked: were the head significantly slower (and faster nowhere), only the verified, honest rep would be
    assert "outputs_partly_verified" not in r.receipt["models"]["fake"], r.receipt["models"]["fake"]
    assert r.verdict is Verdict.REJECT, text(r)
    assert "prefill@64: head's timed outputs differ from the reference" in r.summary, r.summary
