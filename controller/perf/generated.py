"""The shared `--write/--check` command line of the generators of committed files (`figures_gen`,
`physics_gen`, `steps_gen`, controller.sim.demo_trace), and the pieces of the table modules they print.

A generator renders the file's text from the shared data; `--write` replaces the committed file with it,
`--check` exits 1 (naming the command that regenerates it) when the committed file differs. `run` is the
whole command line of a generator with nothing more; `parser`, `write` and `check` are its parts, for a
generator that adds a mode. Must not: compute any table (the generators do), or write anything but the
one file it is given, and only when asked to.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def parser(module: str, doc: str | None, path: Path,
           modes: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """`--write`, `--check` (one required), the `modes` (extra exclusive flag -> help) and `--data-dir`
    of `python -m <module>`, described by the first line of the generator's docstring."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"regenerate {path.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {path.name} is not what --write makes")
    for flag, help_text in (modes or {}).items():
        mode.add_argument(flag, action="store_true", help=help_text)
    ap.add_argument("--data-dir", default=None, help="shared data directory (default: shared_data_dir())")
    return ap


def data_dir_of(args: argparse.Namespace) -> Path | None:
    """The `--data-dir` given, or None for the default shared data directory."""
    return Path(args.data_dir) if args.data_dir else None


def write(path: Path, text: str) -> int:
    """Replace `path` with `text`; the exit code of `--write`."""
    path.write_text(text)
    print(f"wrote {path}")
    return 0


# Fitted figures differ in their last digits from one CPU to another (numpy's SIMD paths and the BLAS
# sum in different orders): --check accepts numbers equal to this relative tolerance, far below any
# figure's own precision (the tables print 16-17 significant digits).
REL_TOL = 1e-9
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def same_up_to_rounding(a: str, b: str, rel: float = REL_TOL) -> bool:
    """True when `a` and `b` are the same text but for numbers equal within `rel` (relative).
    Example: "x = 0.010107362960377599," and "x = 0.010107362960377592," → True; "x = 0.0101" and
    "x = 0.0102" → False; "x = 1" and "y = 1" → False."""
    if a == b:
        return True
    na, nb = _NUMBER.findall(a), _NUMBER.findall(b)
    if len(na) != len(nb) or _NUMBER.sub("#", a) != _NUMBER.sub("#", b):
        return False
    return all(x == y or math.isclose(float(x), float(y), rel_tol=rel, abs_tol=0.0)
               for x, y in zip(na, nb, strict=True))


def check(path: Path, expected: str, module: str, details: Sequence[str] = ()) -> int:
    """The exit code of `--check`: 1, with `details` (one line each) on stderr, when `path` is missing,
    does not hold `expected` (up to rounding in the last digits, `same_up_to_rounding`) or there is any
    detail; else 0."""
    if details or not path.exists() or not same_up_to_rounding(path.read_text(), expected):
        print(f"{path} is stale: run `python -m {module} --write`", file=sys.stderr)
        for d in details:
            print(f"  {d}", file=sys.stderr)
        return 1
    print(f"{path.name} is up to date")
    return 0


def run(argv: Sequence[str] | None, module: str, doc: str | None, path: Path,
        render: Callable[[Path | None], str]) -> int:
    """The command line of a generator whose file is `render(data_dir)`: `--write` or `--check`."""
    args = parser(module, doc, path).parse_args(argv)
    text = render(data_dir_of(args))
    return write(path, text) if args.write else check(path, text, module)


def table_module(doc: Sequence[str], declaration: str, rows: Sequence[str]) -> str:
    """The text of a generated table module: its docstring (`doc`, one entry a line), the imports every
    table module has, and one mapping opened by `declaration` ("NAME: Mapping[...] = {") holding `rows`."""
    lines = ['"""' + doc[0], *doc[1:], '"""', "", "from __future__ import annotations", "",
             "from collections.abc import Mapping", "", declaration, *rows, "}"]
    return "\n".join(lines) + "\n"


def tuple_lines(texts: Sequence[str], per_line: int) -> list[str]:
    """A tuple of the printed `texts` as a row of a generated table, `per_line` values a line."""
    lines = ["        ("]
    lines.extend("            " + ", ".join(texts[i:i + per_line]) + "," for i in range(0, len(texts), per_line))
    lines.append("        ),")
    return lines
