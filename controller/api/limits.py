"""Bounds on what the operator API accepts, and how operator-supplied strings are echoed and printed.

Every string an operator sends (author, reason, pool, ids...) ends up in the state store, in the audit
trail, in explain records and on somebody's terminal. So the API refuses:
- strings longer than their field's bound (MAX_* below), checked *before* anything echoes them, so an
  error about a 1 MB field is a short INVALID_ARGUMENT, not a 1 MB one;
- control characters (C0/C1: ESC, CR, NUL, ...), line/paragraph separators and the bidirectional
  overrides of "Trojan Source" (CVE-2021-42574): they can clear a screen, forge lines or reorder
  text on the terminal that prints them.

`shown()` is the bounded, escaped form of a value quoted in an error message; `printable()` is the
escaped form of a stored string a CLI prints (data written before these checks, or by a newer
daemon, is never trusted to be clean). This module holds no gRPC or store logic.
"""

from __future__ import annotations

import unicodedata

# Who: a person's login or e-mail, a token's name, a certificate's CN (X.509 caps a CN at 64
# characters, RFC 5280 ub-common-name) or DNS SAN (253). 256 covers all of them.
MAX_AUTHOR = 256
# Why: a sentence or two for the audit trail.
MAX_REASON = 500
# Audit entries per ListAudit answer. An entry is at most ~1,400 characters (author, caller, the override's
# names and reason at their bounds), 5.6 KB in 4-byte UTF-8: 500 of them stay under gRPC's default 4 MiB
# message limit, which six 1 MB reasons used to exceed (tests/reliability/test_input_limits.py).
MAX_AUDIT_LIMIT = 500
# Overrides: active at once (default; `api.max_overrides` sets it, up to MAX_OVERRIDES_CEILING) and expired
# ones kept for `override list --all`. Every explain record and every tick carries the active ones: 2,000
# took the step from 1 ms to 20 ms (~10 us each), so 200 cost <= 2 ms a tick, and 200 is 50 pools with a
# pin, min, max and freeze each. The ceiling keeps ListOverrides(include_expired) under 4 MiB at every bound.
DEFAULT_MAX_OVERRIDES = 200
MAX_OVERRIDES_CEILING = 500
KEEP_EXPIRED_OVERRIDES = 100
# Names (pool, priority class, profile, override and decision ids): a DNS-1123 subdomain is at most
# 253 characters, and every name Governor issues or accepts is shorter.
MAX_NAME = 253
# One request: the largest valid request (an override with every string at its bound, 4 bytes per
# character) is under 5 KiB; 64 KiB leaves room for metadata and is far below gRPC's 4 MiB default,
# which a 1 MB field used to reach.
MAX_REQUEST_BYTES = 64 * 1024
# Characters of a bad value quoted back in an error message.
MAX_ECHO = 64

# Bidirectional embedding/override/isolate controls and marks (Unicode TR9), the "Trojan Source" set.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cs"})  # controls, line/paragraph separators, surrogates


def bad_character(text: str) -> tuple[int, str] | None:
    """(index, character) of the first character the API refuses in `text`, or None when it is clean."""
    for i, ch in enumerate(text):
        if ch in _BIDI or unicodedata.category(ch) in _REFUSED_CATEGORIES:
            return i, ch
    return None


def text_problem(text: str, max_len: int) -> str | None:
    """Why `text` is not acceptable for a field bounded at `max_len` characters, or None when it is."""
    if len(text) > max_len:
        return f"is too long ({len(text)} characters, at most {max_len})"
    bad = bad_character(text)
    if bad is not None:
        i, ch = bad
        return (f"contains control character U+{ord(ch):04X} at position {i}; control characters (ESC, CR, NUL, "
                "...), line separators and bidirectional overrides are not allowed")
    return None


def shown(value: object, limit: int = MAX_ECHO) -> str:
    """repr(value) cut to `limit` characters: what an error message may quote of a bad value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_NAMED_ESCAPES = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every character `bad_character` would refuse written as an escape (\\x1b, \\u202e), so a
    stored string cannot drive the terminal that prints it. `keep_newlines` keeps \\n (multi-line text)."""
    out: list[str] = []
    for ch in text:
        if keep_newlines and ch == "\n":
            out.append(ch)
        elif ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif ch in _BIDI or unicodedata.category(ch) in _REFUSED_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)
