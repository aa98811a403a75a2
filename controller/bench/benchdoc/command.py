"""`governor bench report`: docs/BENCHMARKS.md's tables and plots from the saved bench results.

    governor bench report                 rewrite every generated region and plot from docs/bench/*.json
    governor bench report --check         exit 1 if a region differs from what the saved results render
    governor bench report --run planner-budget,tick-scrape   rerun those benches, save, then rewrite
    governor bench report --run all       rerun every bench (slow: `make benchmarks-doc`)
    governor bench report --import all --file bench-out/all.json --commit 069a21a   save an output made elsewhere
    governor bench report --list          the results, their commands and the commit each was saved at

With --json each prints exactly one JSON object on stdout. Exit codes: 0 done (or up to date), 1 a
region is stale (--check) or a bench failed, 2 bad input (unknown result, unpaired markers, a result
missing or not what its command prints).
Must not: write outside docs/bench/ and the files in DOCS (and the benches' own --out defaults).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from controller.bench.benchdoc import charts, regions, render, sources

DOCS = ("docs/BENCHMARKS.md", "docs/RELIABILITY.md", "README.md")  # the files whose bench regions the renderer owns


class ReportError(ValueError):
    """Bad input to the report; the message is what the user sees."""


def needed(texts: Mapping[str, str]) -> dict[str, list[str]]:
    """Region name → the files it appears in; ReportError for a region nothing renders."""
    out: dict[str, list[str]] = {}
    for path, text in texts.items():
        for r in regions.find(text, path):
            if r.name not in render.REGIONS:
                raise ReportError(f"{path}:{r.line}: nothing renders bench:{r.name} "
                                  "(controller/bench/benchdoc/render.py: REGIONS)")
            out.setdefault(r.name, []).append(path)
    return out


def load_results(names: Sequence[str], folder: Path) -> dict[str, dict[str, Any]]:
    return {n: sources.load(n, folder) for n in sorted(set(names))}


def bodies(region_names: Sequence[str], results: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {n: render.REGIONS[n].render(results) for n in region_names}


def build(root: Path, folder: Path) -> tuple[dict[str, str], dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    """(current text per doc, rendered body per doc and region, the results read)."""
    texts = {d: (root / d).read_text() for d in DOCS if (root / d).is_file()}
    used = needed(texts)
    wanted = [s for n in used for s in render.REGIONS[n].sources]
    wanted += [s for c in charts.CHARTS for s in c.sources]
    results = load_results(wanted, folder)
    per_doc = {d: bodies([r.name for r in regions.find(t, d)], results) for d, t in texts.items()}
    return texts, per_doc, results


def check(root: Path, folder: Path) -> dict[str, Any]:
    texts, per_doc, _ = build(root, folder)
    stale = {d: regions.stale(t, per_doc[d], d) for d, t in texts.items()}
    missing = [c.file for c in charts.CHARTS if not (folder / c.file).is_file()]
    return {"ok": not any(stale.values()) and not missing, "stale_regions": {d: v for d, v in stale.items() if v},
            "missing_charts": missing, "regions": {d: list(b) for d, b in per_doc.items()}}


def write(root: Path, folder: Path) -> dict[str, Any]:
    texts, per_doc, results = build(root, folder)
    changed = []
    for d, t in texts.items():
        new = regions.rewrite(t, per_doc[d], d)
        if new != t:
            (root / d).write_text(new)
            changed.append(d)
    drawn = charts.draw_all(results, folder)
    return {"ok": True, "changed": changed, "charts": [str(p.relative_to(root)) for p in drawn],
            "regions": {d: list(b) for d, b in per_doc.items()}}


def cmd_bench_report(args: argparse.Namespace) -> int:
    root = Path(getattr(args, "root", None) or sources.ROOT)
    folder = root / "docs" / "bench"
    as_json = getattr(args, "json", False)

    def emit(obj: dict[str, Any], text: str) -> None:
        print(json.dumps(obj, sort_keys=True) if as_json else text)

    try:
        if args.list:
            rows = sources.describe(folder=folder)
            def line(r: dict[str, Any]) -> str:
                how = "recorded" if r["recorded"] else f"~{r['minutes']:g} min"
                commit = str((r["saved"] or {}).get("commit", "missing"))[:7]
                return f"{r['name']:<28} {how:<9} {commit:<8} {r['command']}"

            emit({"results": rows}, "\n".join(line(r) for r in rows))
            return 0
        ran: list[str] = []
        if args.import_name:
            if not args.file or not args.commit:
                raise ReportError("--import NAME needs --file (the command's output) and --commit (where it ran)")
            src = sources.by_name().get(args.import_name)
            if src is None:
                raise ReportError(f"unknown result {args.import_name!r}; known: {', '.join(sources.by_name())}")
            sources.import_output(src, Path(args.file), commit=args.commit, wall_s=args.wall_s,
                                  ran_as=args.ran_as, folder=folder)
            ran.append(src.name)
        if args.run:
            # the checkout's state once, before the first run: each result saved changes docs/bench/, which
            # would mark every later run of the list as run with local changes
            head = sources.git_head(root)
            for src in sources.select(args.run):
                path = sources.run(src, repo=root, folder=folder, head=head)
                ran.append(src.name)
                print(f"saved {path}", file=sys.stderr)
        if args.check:
            out = check(root, folder)
            lines = [f"{d}: stale {', '.join(v)}" for d, v in out["stale_regions"].items()]
            lines += [f"docs/bench/{c}: missing" for c in out["missing_charts"]]
            emit(out, "\n".join(lines) if lines else
                 "the generated regions match the saved results (governor bench report writes them)")
            return 0 if out["ok"] else 1
        out = write(root, folder)
        out["ran"] = ran
        emit(out, f"rewrote {', '.join(out['changed']) or 'nothing (up to date)'}; plots: {', '.join(out['charts'])}")
        return 0
    except (ReportError, sources.SourceError, regions.RegionError) as exc:
        if as_json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"governor bench report: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, sources.SourceError) and "exited" in str(exc) else 2
