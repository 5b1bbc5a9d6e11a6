"""Fault injection: revisions of the runtime that misbehave must get the right verdict, with a reason.

None of them may pass, and no infrastructure fault may come out as REJECT.
"""
import json
import socket

import pytest

from worker.records import InfraKind, Verdict
from worker.sandbox import detect_isolation

from tests.worker.helpers import eval_fakes


CASES = [
    # variant, verdict, infra kind, words the reason must contain. A head that fails where base ran the
    # same work fine is the PR's fault: REJECT after one confirming attempt (worker/verdicts/attribution.py).
    ("import_error", Verdict.BUILD_FAILED, None, "does_not_exist_tokengate"),
    ("load_fail", Verdict.REJECT, None, "failed to map tensor"),
    ("oom", Verdict.REJECT, None, "MemoryError"),
    ("silent", Verdict.REJECT, None, "without answering"),
    ("nan", Verdict.REJECT, None, "not finite"),
    ("zero", Verdict.REJECT, None, "constant"),
    ("hang", Verdict.REJECT, None, "no answer within"),
    ("bad_protocol", Verdict.BUILD_FAILED, None, "generate_greedy"),
    ("forge_answer", Verdict.BUILD_FAILED, None, "process tree killed"),
]


@pytest.mark.sandbox
@pytest.mark.parametrize("variant,verdict,kind,words", CASES, ids=[c[0] for c in CASES])
def test_fault_gives_the_right_verdict(tmp_path, cache, variant, verdict, kind, words):
    # the hang waits out the request timeout on both attempts: 3 s instead of the helper's 6 (the fakes answer in ms)
    r = eval_fakes(tmp_path, head=variant, **({"request_timeout_s": 3} if variant == "hang" else {}))
    assert r.verdict == verdict, r.summary
    assert r.infra_kind == kind
    assert words in (r.infra_detail or "") + r.summary + (r.build_log_tail or ""), r.summary
    assert r.verdict not in (Verdict.XL, Verdict.L, Verdict.M, Verdict.S, Verdict.NONE)
    if r.verdict is Verdict.REJECT:  # confirmed on a second attempt, and says what failed where
        assert r.failure and r.failure["attempts"] == 2 and r.failure["role"] == "head", r.failure
        assert "both attempts" in r.summary and r.failure["phase"] in r.summary
    json.dumps(r.to_dict())  # the record stays serialisable on every path


@pytest.mark.sandbox
def test_broken_baseline_is_infra_not_reject(tmp_path, cache):
    r = eval_fakes(tmp_path, base="load_fail")
    assert r.verdict == Verdict.INFRA and r.infra_kind == InfraKind.BASELINE_CRASHED, r.summary


@pytest.mark.sandbox
def test_fake_timing_is_not_believed(tmp_path, cache):
    """Slow decode that freezes its own clocks and prints fake speeds: the parent's clock sees it."""
    r = eval_fakes(tmp_path, head="fake_timing", pairs=4, inner=2)
    assert r.verdict == Verdict.REJECT, r.summary
    assert "decode@32" in r.summary


@pytest.mark.sandbox
def test_socket_is_blocked(tmp_path, cache):
    iso = detect_isolation()
    if not iso.network_isolated:
        pytest.skip(f"no network isolation on this host: {iso.reason}")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    variant = tmp_path / "v"
    from tests.worker.helpers import FAKES
    import shutil
    shutil.copytree(FAKES / "variants" / "socket", FAKES / "variants" / f"socket_{port}", dirs_exist_ok=True)
    try:
        (FAKES / "variants" / f"socket_{port}" / "runtime" / "_target.txt").write_text(str(port))
        r = eval_fakes(tmp_path, head=f"socket_{port}")
    finally:
        shutil.rmtree(FAKES / "variants" / f"socket_{port}", ignore_errors=True)
    with pytest.raises(socket.timeout):
        srv.accept()  # nothing ever reached us
    srv.close()
    assert r.verdict == Verdict.BUILD_FAILED, r.summary
    assert "unreachable" in (r.build_log_tail or "") + r.summary.lower() or "Errno" in (r.build_log_tail or "")
    assert variant is not None


@pytest.mark.sandbox
def test_env_token_is_not_visible(tmp_path, cache, monkeypatch):
    secret = "ghs_s3cretInstallationToken"
    monkeypatch.setenv("GITHUB_TOKEN", secret)
    monkeypatch.setenv("TOKENGATE_DATABASE_URL", "postgresql://bot:pw@db/tokengate")
    r = eval_fakes(tmp_path, head="env_token", secrets=[secret])
    # The revision raises if it finds any token; scrubbed, it runs normally.
    assert r.verdict not in (Verdict.BUILD_FAILED, Verdict.INFRA), r.summary
    assert secret not in json.dumps(r.to_dict())
