"""Java Properties text, the form upstream DLedger keeps `currterm` (and, in older versions,
`checkpoint`) in (docs/format.md, "Opening upstream DLedger's stores").

Read as `java.util.Properties.load(InputStream)` does: ISO-8859-1, `#` or `!` comment lines,
`key=value`, `key:value` or `key value`, whitespace around the separator skipped, a line
ending in an odd number of backslashes continued on the next one, `\\uXXXX` and `\\t \\n \\r
\\f` escapes. Written so that both readers read back exactly what was written.
"""

from __future__ import annotations

import re

_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


class PropertiesError(ValueError):
    """Text Java's Properties.load would reject (a malformed `\\u` escape)."""


def _logical_lines(text: str) -> list[str]:
    out: list[str] = []
    pending: str | None = None
    for natural in re.split(r"\r\n|\r|\n", text):
        line = natural.lstrip(_WS)
        if pending is None and (not line or line[0] in "#!"):
            continue  # comments and blank lines are never continued
        trailing = len(line) - len(line.rstrip("\\"))
        continued = trailing % 2 == 1
        if continued:
            line = line[:-1]
        pending = line if pending is None else pending + line
        if not continued:
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


def _unescape(s: str) -> str:
    out: list[str] = []
    k = 0
    while k < len(s):
        c = s[k]
        k += 1
        if c != "\\" or k == len(s):
            out.append(c)  # a lone trailing backslash is dropped by Java; harmless here
            continue
        c = s[k]
        k += 1
        if c == "u":
            digits = s[k : k + 4]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise PropertiesError(f"malformed \\uxxxx escape: \\u{digits}")
            out.append(chr(int(digits, 16)))
            k += 4
        else:
            out.append(_ESCAPES.get(c, c))
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    """Key and value of a logical line: the key ends at the first unescaped `=`, `:` or
    whitespace; whitespace, then one `=` or `:`, then whitespace, separate it from the value."""
    k = 0
    while k < len(line):
        c = line[k]
        if c == "\\":
            k += 2
            continue
        if c in "=:" or c in _WS:
            break
        k += 1
    key, rest = line[:k], line[k:]
    rest = rest.lstrip(_WS)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WS)
    return _unescape(key), _unescape(rest)


def parse_properties(raw: bytes) -> dict[str, str]:
    """The key/value pairs of `raw` (a later key wins, as in Java); PropertiesError when Java
    would refuse the text."""
    return dict(_split(line) for line in _logical_lines(raw.decode("latin-1")))


def _escape(s: str, key: bool) -> str:
    out: list[str] = []
    for k, c in enumerate(s):
        if c == " " and (key or k == 0):
            out.append("\\ ")
        elif c in "\\=:#!":
            out.append("\\" + c)
        elif c in "\t\n\r\f":
            out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[c])
        elif " " <= c <= "~":
            out.append(c)
        else:
            out.extend(f"\\u{u:04X}" for u in _utf16(c))
    return "".join(out)


def _utf16(c: str) -> list[int]:
    b = c.encode("utf-16-be")
    return [int.from_bytes(b[k : k + 2], "big") for k in range(0, len(b), 2)]


def format_properties(pairs: dict[str, str]) -> bytes:
    """`key=value` lines, escaped so Properties.load (and parse_properties) read them back."""
    return "".join(f"{_escape(k, True)}={_escape(v, False)}\n" for k, v in pairs.items()).encode("latin-1")


__all__ = ["PropertiesError", "format_properties", "parse_properties"]
