"""The prefill profiler's GPU-busy figure: the union of kernel intervals, never their sum."""
from bench.profiling.prefill_profile import busy_seconds


def test_busy_is_the_union_of_kernel_intervals():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0.0, 1.0), (2.0, 3.0)]) == 2.0  # a gap between kernels is idle time
    assert busy_seconds([(0.0, 2.0), (1.0, 3.0), (1.5, 1.8)]) == 3.0  # overlapping streams count once
    assert busy_seconds([(5.0, 6.0), (0.0, 1.0)]) == 2.0  # order of events does not matter


def test_a_given_file_is_profiled_and_a_missing_one_is_named(tmp_path):
    """--gguf: the MoE's 21 GB file is made once per box (bench/runtime/moe.py), never again by the profiler."""
    import json

    import pytest

    from bench.profiling import prefill_profile
    from runtime.synth.factory import synthesize

    with pytest.raises(SystemExit, match="no-such.gguf: no such file"):
        prefill_profile.main(["--device", "cpu", "--gguf", str(tmp_path / "no-such.gguf"), "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
    f = synthesize("tiny", "q8_0", 3, tmp_path / "given.gguf", workers=1).path
    assert prefill_profile.main(["--device", "cpu", "--gguf", str(f), "--shape", "tiny", "--length", "8",
                                 "--warmup", "0", "--repeats", "1", "--out", str(tmp_path / "r")]) == 0
    (rec,) = (tmp_path / "r").glob("prefill-profile-tiny-*.json")
    r = json.loads(rec.read_text())
    assert r["gguf"] == "given.gguf" and r["profiled"]["gpu_busy_s"] is None and r["profiled"]["reason"]
