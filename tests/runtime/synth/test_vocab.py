from runtime.synth.vocab import (REAL_FIRST_PAD, REAL_FIRST_SPECIAL, TOKEN_CONTROL, TOKEN_UNUSED, build_vocab,
                                 byte_to_unicode, check_vocab)


def test_tiny_vocab_valid_with_specials_at_the_end():
    v = build_vocab(4096)
    assert len(v.tokens) == len(v.token_types) == 4096
    assert check_vocab(v) == []
    assert v.tokens[:256] == [byte_to_unicode()[b] for b in range(256)]
    assert v.tokens[-1] == "</think>" and v.tokens[v.eos_token_id] == "<|im_end|>"
    assert len(v.merges) == 4096 - 256 - 26


def test_real_vocab_special_ids_and_padding():
    v = build_vocab(248320)
    assert len(v.tokens) == 248320 and check_vocab(v) == []
    assert v.tokens[248044:248047] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert v.tokens[248068:248070] == ["<think>", "</think>"]
    assert v.eos_token_id == 248046 and v.padding_token_id == 248044
    assert set(v.token_types[REAL_FIRST_SPECIAL:REAL_FIRST_PAD]) == {TOKEN_CONTROL}
    assert set(v.token_types[REAL_FIRST_PAD:]) == {TOKEN_UNUSED}
    assert v.tokens[REAL_FIRST_PAD] == f"[PAD{REAL_FIRST_PAD}]"


def test_check_vocab_catches_a_broken_merge():
    v = build_vocab(4096)
    v.merges[5] = "zz qq"
    assert any("zz" in p for p in check_vocab(v))
