"""docs/BENCHMARKS.md as a report: its tables and plots rendered from saved bench results.

`sources` lists the results (docs/bench/<name>.json: a bench command's JSON with the command and
the commit that made it) and runs or imports them; `regions` finds the generated regions of a doc
(`<!-- bench:NAME begin -->` … `<!-- bench:NAME end -->`); `render` says what each region shows;
`charts` draws the plots; `command` is `governor bench report` (and `make benchmarks-doc`).
"""
