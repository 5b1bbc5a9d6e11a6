"""bench/llamacpp/llamacpp_receipt.py: llama-bench's JSON -> receipt, and the tg128 table decode.py reads from it."""
import hashlib
import json

from bench.llamacpp.llamacpp_receipt import main, tg128_by_depth


def _llama_bench_json(path, depths_ts):
    """What `llama-bench -o json` prints: one object per test (fields as in llama-bench.cpp)."""
    tests = [{"build_commit": "3f545becc", "gpu_info": "NVIDIA H200", "n_prompt": 0, "n_gen": 128, "n_depth": d,
              "type_k": "f16", "flash_attn": True, "n_ubatch": 512, "avg_ts": sum(ts) / len(ts), "samples_ts": ts}
             for d, ts in depths_ts.items()]
    tests.append({"n_prompt": 512, "n_gen": 0, "n_depth": 0, "samples_ts": [9000.0, 12000.0, 12100.0]})
    path.write_text(json.dumps(tests))


def test_receipt_has_provenance_medians_and_the_tg128_table(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(200)))
    lb = tmp_path / "llama-9b.json"
    _llama_bench_json(lb, {0: [213.9, 219.6, 221.6, 222.0, 222.0], 16384: [205.8, 208.4, 208.2, 209.9, 208.2]})
    out = tmp_path / "out"
    assert main(["--llama-commit", "3f545be", "--flags", "-fa 1", "--out", str(out), f"9b={gguf}:{lb}",
                 f"4b={gguf}:{tmp_path / 'absent.json'}"]) == 0
    (path,) = out.glob("llamacpp-bench-*.json")
    rec = json.loads(path.read_text())
    assert rec["kind"] == "llamacpp_bench" and rec["llama_cpp_commit"] == "3f545be"
    assert rec["missing"] == [{"shape": "4b", "reason": f"no llama-bench output at {tmp_path / 'absent.json'}"}]
    tg = tg128_by_depth(rec)
    assert set(tg) == {"9b"} and set(tg["9b"]) == {0, 16384}  # the pp512 test is not a tg128 figure
    r0 = tg["9b"][0]
    assert r0["median"] == 221.6 and r0["n"] == 5
    assert abs(r0["spread_pct"] - 100 * (222.0 - 213.9) / 221.6) < 1e-9
    assert r0["gguf_sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest() and r0["path"] == str(gguf)


def test_no_results_is_a_failure_not_an_empty_success(tmp_path):
    empty = tmp_path / "llama.json"
    empty.write_text("")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    assert main(["--llama-commit", "c", "--flags", "f", "--out", str(tmp_path), f"9b={gguf}:{empty}"]) == 1
