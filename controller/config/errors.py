"""The config's error values: `ConfigError` (what callers catch) and the cross-field validator's problems.

`ConfigError.problems` holds one line per problem, each naming the file, the line, the field path and
what is wrong; `field_path(('pools', 1, 'min_replicas'))` spells a location as `pools[1].min_replicas`.
Must not: import the rest of the config package (every module of it imports this one).
"""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """The configuration is invalid. `problems` holds one line per problem (file:line: field: what is wrong)."""

    def __init__(self, problems: Sequence[str], source: str = "config") -> None:
        self.problems = list(problems)
        self.source = source
        head = f"{source}: {len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        super().__init__(head + "\n" + "\n".join(f"  {p}" for p in self.problems))


class ProblemsError(ValueError):
    """Raised by the cross-field validator: (location, message) pairs, one per problem."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{field_path(loc)}: {msg}" for loc, msg in problems))


def field_path(loc: Sequence[str | int]) -> str:
    """('pools', 1, 'min_replicas') → 'pools[1].min_replicas'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"

