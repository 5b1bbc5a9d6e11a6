"""Same-call llama.cpp ratios for prefill: used only when llama-bench ran on this very file (sha256 equal);
otherwise the anchor, said as such; pp records are told apart from tg ones."""
import pytest

from bench.runtime import prefill
from bench.llamacpp.llamacpp_receipt import pp_by_tokens, tg128_by_depth

RECEIPT = {"results": [
    {"shape": "9b", "n_prompt": 512, "n_gen": 0, "n_depth": 0, "median": 9000.0, "gguf_sha256": "abc", "n": 6},
    {"shape": "9b", "n_prompt": 0, "n_gen": 128, "n_depth": 0, "median": 220.0, "gguf_sha256": "abc"},
    {"shape": "9b", "n_prompt": 4096, "n_gen": 0, "n_depth": 0, "median": None, "reason": "no samples"},
]}


def test_pp_and_tg_records_are_told_apart():
    assert set(pp_by_tokens(RECEIPT)["9b"]) == {512}
    assert set(tg128_by_depth(RECEIPT)["9b"]) == {0}


@pytest.fixture
def same_call(monkeypatch):
    monkeypatch.setattr(prefill, "SAME_CALL_LLAMA", {**pp_by_tokens(RECEIPT), "receipt": "llamacpp-bench-x.json"})


def test_the_same_file_gives_a_same_call_ratio(same_call):
    ref, src = prefill.llama_ref("9b", 512, "abc")
    assert ref == 9000.0 and src["receipt"] == "llamacpp-bench-x.json" and src["gguf_sha256"] == "abc"


@pytest.mark.parametrize("sha", ["other", None])
def test_another_file_falls_back_to_the_anchor_and_says_so(same_call, sha):
    ref, src = prefill.llama_ref("9b", 512, sha)
    assert ref == prefill.LLAMACPP["9b"][512] and src.startswith("anchor")


def test_no_figure_is_none_not_zero(same_call):
    assert prefill.llama_ref("9b", 777, "abc") == (None, None)
