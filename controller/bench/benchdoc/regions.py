"""Generated regions of a Markdown file: find them, check them, rewrite them.

A region is the text between `<!-- bench:NAME begin -->` and `<!-- bench:NAME end -->`. The renderer
owns it and rewrites it whole; everything outside the markers is hand-written and never touched. A
region may span lines (a table: the markers on their own lines) or sit inside a sentence (a figure:
both markers on one line, the text between them without a line break).

Example:
    >>> text = "a <!-- bench:x begin -->1<!-- bench:x end --> b"
    >>> [r.name for r in find(text)]
    ['x']
    >>> rewrite(text, {"x": "2"})
    'a <!-- bench:x begin -->2<!-- bench:x end --> b'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

MARKER = re.compile(r"<!-- bench:(?P<name>[a-z0-9][a-z0-9-]*) (?P<edge>begin|end) -->")


class RegionError(ValueError):
    """Markers that do not pair up, or a region nobody renders; the message names the line."""


@dataclass(frozen=True)
class Region:
    name: str
    start: int  # offset just after the begin marker
    end: int  # offset of the end marker
    line: int  # 1-based line of the begin marker
    inline: bool  # both markers on one line


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def find(text: str, where: str = "text") -> list[Region]:
    """Every region in `text`, in order; RegionError when markers are unpaired, nested or repeated."""
    out: list[Region] = []
    open_name: str | None = None
    open_at = body_at = 0
    seen: set[str] = set()
    for m in MARKER.finditer(text):
        name, edge = m.group("name"), m.group("edge")
        if edge == "begin":
            if open_name is not None:
                raise RegionError(f"{where}:{_line_of(text, m.start())}: bench:{name} begins inside "
                                  f"bench:{open_name} (line {_line_of(text, open_at)})")
            if name in seen:
                raise RegionError(f"{where}:{_line_of(text, m.start())}: bench:{name} appears twice")
            open_name, open_at, body_at = name, m.start(), m.end()
            continue
        if open_name != name:
            raise RegionError(f"{where}:{_line_of(text, m.start())}: bench:{name} ends "
                              + ("without a begin" if open_name is None else f"inside bench:{open_name}"))
        seen.add(name)
        line = _line_of(text, open_at)
        out.append(Region(name, body_at, m.start(), line, inline=line == _line_of(text, m.start())))
        open_name = None
    if open_name is not None:
        raise RegionError(f"{where}:{_line_of(text, open_at)}: bench:{open_name} never ends")
    return out


def rewrite(text: str, bodies: Mapping[str, str], where: str = "text") -> str:
    """`text` with each region's body replaced by `bodies[name]`; RegionError if a region has no body.

    A block region's body is framed by line breaks (markers on their own lines); an inline body must be
    one line."""
    parts: list[str] = []
    at = 0
    for r in find(text, where):
        if r.name not in bodies:
            raise RegionError(f"{where}:{r.line}: nothing renders bench:{r.name} "
                              "(controller/bench/benchdoc/render.py: REGIONS)")
        body = bodies[r.name]
        if r.inline:
            if "\n" in body:
                raise RegionError(f"{where}:{r.line}: bench:{r.name} sits inside a line; its text must be one line")
        else:
            body = "\n" + body.strip("\n") + "\n"
        parts += [text[at:r.start], body]
        at = r.end
    parts.append(text[at:])
    return "".join(parts)


def stale(text: str, bodies: Mapping[str, str], where: str = "text") -> list[str]:
    """Names of the regions whose text differs from what `bodies` renders (in order)."""
    fresh = rewrite(text, bodies, where)
    if fresh == text:
        return []
    new = {r.name: fresh[r.start:r.end] for r in find(fresh, where)}
    return [r.name for r in find(text, where) if text[r.start:r.end] != new[r.name]]
