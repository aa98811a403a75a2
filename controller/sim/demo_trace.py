"""Generator of the demo's packaged trace, controller/sim/demo/azure2023_conv_demo.csv: the 900 s of
the Azure LLM inference trace 2023 (conversation part, CC-BY 4.0) the demo replays, cut from the
shared copy so `governor run --demo` needs nothing outside the installed package.

  python -m controller.sim.demo_trace --write    # regenerate the cut (`make demo-trace`)
  python -m controller.sim.demo_trace --check    # exit 1 if the committed cut differs from a fresh one

The cut keeps every request arriving in [START_S, START_S + DURATION_S) seconds from the trace's
first request, in the generic CSV format (`arrival_s,prompt_tokens,output_tokens`), arrival times
shifted by START_S and written at full precision: the scenario reading it with `start_s: 0` replays
exactly the requests, and the arrival times, that the window of the full trace gives.
Must not: write anything but the cut, and only under --write.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from controller.paths import shared_data_dir
from controller.perf import generated
from controller.sim.trace_csv import read_azure
from controller.sim.trace_transforms import window

DEMO_DIR = Path(__file__).resolve().parent / "demo"
CUT_PATH = DEMO_DIR / "azure2023_conv_demo.csv"
SOURCE = ("traces", "azure2023_conv.csv")
START_S = 1500.0
DURATION_S = 900.0


def render(data_dir: Path | None = None) -> str:
    root = data_dir if data_dir is not None else shared_data_dir()
    trace = window(read_azure(root.joinpath(*SOURCE)), START_S, DURATION_S)
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    lines += [f"{float(t)!r},{int(p)},{int(o)}"
              for t, p, o in zip(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, strict=True)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return generated.run(argv, "controller.sim.demo_trace", __doc__, CUT_PATH, render)


if __name__ == "__main__":
    raise SystemExit(main())
