"""Text that came from a PR (exception messages, log tails, branch names, titles), made safe for a comment.

`inline` is for running text: HTML and Markdown are escaped, line breaks folded (no headings, tables
or lists can start), @mentions, autolinks, references and math defused, size capped. `code_block` fences
a log with more backticks than any run inside it (it cannot be closed from inside) and caps it from the end.
Neither can ever emit `<!--` from PR text, so a PR cannot hide the real verdict in an HTML comment.
"""
from __future__ import annotations

import re

INLINE_CAP = 600
BLOCK_CAP = 3000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")  # incl. bidi overrides
_MD = re.compile(r"([\\`*_\[\]|~#!])")
# What GitHub does to a comment's text after Markdown: it pings `@name` after any ASCII non-word character
# (é@octocat, 中@org/team: Python's \w takes é and 中 for word characters), autolinks `http(s)://`, `ftp://`,
# `www.` and e-mail addresses, references `#1`, `owner/repo#1` and `GH-1` (a cross-reference on that issue, in
# the bot's name), and renders `$…$` as LaTeX after Markdown's escapes. A zero-width space goes where one would
# start; `$` is escaped.
_MENTION = re.compile(r"(?<![A-Za-z0-9_])@(?=[A-Za-z0-9])|@(?=[A-Za-z0-9_\\-]+\.[A-Za-z0-9])")
_LINKISH = re.compile(r"(?i)(?<=:/)(?=/)|(?<=www)(?=\.)|(?<=#)(?=\d)|(?<=\bGH-)(?=\d)")


def _cap(text: str, cap: int, keep_end: bool = False) -> str:
    if len(text) <= cap:
        return text
    return ("…" + text[-cap:]) if keep_end else (text[:cap] + "…")


def inline(text: object, cap: int = INLINE_CAP) -> str:
    s = _CONTROL.sub(" ", str(text if text is not None else ""))
    s = _cap(" ".join(s.split()), cap)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD.sub(r"\\\1", s).replace("$", "\\$")
    s = _MENTION.sub("@\u200b", s)  # no notifications from PR text (gate names like decode@512 stay)
    return _LINKISH.sub("\u200b", s)  # no links or references made in the bot's name


def code_block(text: object, cap: int = BLOCK_CAP, lang: str = "") -> str:
    s = _CONTROL.sub("", str(text if text is not None else "").replace("\r\n", "\n").replace("\t", "    "))
    s = _cap(s, cap, keep_end=True).replace("<!--", "<!-\u200b-")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{s}\n{fence}"


def code_span(text: object, cap: int = 120) -> str:
    """Inline code (branch names): fenced by one more backtick than its longest run, so a backtick in a
    ref name (git allows it) cannot close the span and let `<!--` or Markdown after it render."""
    s = plain(text, cap)
    fence = "`" * (max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def plain(text: object, cap: int = 200) -> str:
    """One line without control characters (commit titles, check titles): no Markdown is rendered there."""
    return _cap(" ".join(_CONTROL.sub(" ", str(text or "")).split()), cap)


FILTERS = {"md": inline, "codeblock": code_block, "code": code_span, "plain": plain}
