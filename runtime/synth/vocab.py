"""A dummy byte-level BPE vocabulary that llama.cpp accepts for a `qwen35` GGUF.

Layout (ids):
  0 … 255            the 256 byte tokens, in GPT-2's byte→unicode order
  256 … n_base-1     merged tokens "ab" built from two existing tokens, one merge each
  n_base …           special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, …, CONTROL)
  then               `[PAD<i>]` fillers (UNUSED) up to vocab_size

For the real vocabulary size (248320) the specials sit at their real ids (§10 of the
architecture reference: <|endoftext|> = 248044 …) and fillers start at 248077.  Smaller
vocabularies put the specials just before the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

REAL_VOCAB = 248320
REAL_FIRST_SPECIAL = 248044
REAL_FIRST_PAD = 248077

# Qwen3.5 special tokens in id order from 248044 (§10). 248060…248063 are the four FIM tokens.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    eos_token_id: int
    padding_token_id: int
    endoftext_id: int

    def __len__(self) -> int:
        return len(self.tokens)


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable unicode character mapping."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _layout(vocab_size: int) -> tuple[int, int]:
    """(first special id, first filler id)."""
    n_special = len(SPECIAL_TOKENS)
    if vocab_size == REAL_VOCAB:
        return REAL_FIRST_SPECIAL, REAL_FIRST_PAD
    if vocab_size < 256 + n_special + 1:
        raise ValueError(f"vocab_size {vocab_size} too small: need at least {256 + n_special + 1} (256 bytes + specials + 1 merge)")
    first_special = vocab_size - n_special
    return first_special, vocab_size


def build_vocab(vocab_size: int) -> Vocab:
    """Deterministic vocabulary of exactly `vocab_size` tokens with merges consistent with it."""
    first_special, first_pad = _layout(vocab_size)
    b2u = byte_to_unicode()
    byte_tokens = [b2u[b] for b in range(256)]
    tokens: list[str] = list(byte_tokens)
    merges: list[str] = []
    seen = set(tokens)
    n_merged = first_special - 256
    # Merge left ∘ right where both already exist: first all byte pairs (row by row), then
    # pairs whose left part is an earlier merged token. Each merge creates exactly one new token.
    left = 0
    while len(merges) < n_merged:
        for right in range(256):
            if len(merges) == n_merged:
                break
            a, b = tokens[left], byte_tokens[right]
            if a + b in seen:
                continue
            merges.append(f"{a} {b}")
            tokens.append(a + b)
            seen.add(a + b)
        left += 1
    n_ctrl = first_pad - first_special
    specials = list(SPECIAL_TOKENS[:n_ctrl])
    # The real vocabulary has a few more control ids up to 248076; their names are not
    # needed by anything here, so they get reserved placeholder names.
    specials += [f"<|reserved_{first_special + i}|>" for i in range(len(specials), n_ctrl)]
    tokens.extend(specials)
    n_fill = vocab_size - len(tokens)
    tokens.extend(f"[PAD{first_pad + i}]" for i in range(n_fill))
    types = [TOKEN_NORMAL] * first_special + [TOKEN_CONTROL] * (first_pad - first_special) + [TOKEN_UNUSED] * n_fill
    assert len(tokens) == vocab_size == len(types)
    im_end = first_special + SPECIAL_TOKENS.index("<|im_end|>")
    eot = first_special + SPECIAL_TOKENS.index("<|endoftext|>")
    return Vocab(tokens, types, merges, eos_token_id=im_end, padding_token_id=eot, endoftext_id=eot)


def check_vocab(v: Vocab) -> list[str]:
    """Problems that would make llama.cpp reject or mis-tokenise with this vocabulary (empty = fine)."""
    problems = []
    index = {t: i for i, t in enumerate(v.tokens)}
    if len(index) != len(v.tokens):
        problems.append("duplicate token strings")
    for b, ch in byte_to_unicode().items():
        if ch not in index:
            problems.append(f"byte token {ch!r} (byte {b}) missing")
    for m in v.merges:
        parts = m.split(" ")
        if len(parts) != 2:
            problems.append(f"merge {m!r} is not two parts")
            continue
        a, b = parts
        for p in (a, b, a + b):
            if p not in index:
                problems.append(f"merge {m!r}: token {p!r} missing")
    if len(v.token_types) != len(v.tokens):
        problems.append("token_type length differs from tokens")
    return problems
