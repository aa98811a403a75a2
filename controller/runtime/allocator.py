"""Process-wide memory allocator settings for the numeric hot paths (planner ticks, bulk predicts).

glibc's malloc serves every block of 128 KiB or more (a numpy array of 16,384 floats) with a fresh
mmap and unmaps it on free, and hands the top of the heap back to the kernel as soon as more than
128 KiB is free there; it raises those thresholds only after a large block has been freed, so a
fresh process pays a page fault per touched page of every such temporary. The MPC planner and the
coupling models' bulk predict create hundreds of them per tick. Measured on the reference machine
(2 vCPUs, load < 0.7), without → with the settings below:

- `governor bench planner --ticks 60`: CPU per tick p50 89.0 → 83.4 ms, p99 110.5 → 95.2 ms, peak
  resident size 71.2 → 71.6 MB;
- a 100,000-row `CouplingModels.predict` (`governor bench models`' predict_ms_10k): 63 → 45 ms;
- `governor bench tick` (200 replicas by scrape): resident size 152.8 → 153.4 MB, tick unchanged.

The settings: large blocks come from the heap up to 32 MiB (glibc's own ceiling for its dynamic
threshold on 64-bit), and the heap keeps 64 MiB of headroom at its top instead of trimming to the
byte. Memory the process never touches is not resident, so this costs address space, not RSS.
`GOVERNOR_TUNE_MALLOC=0` leaves the allocator alone. Elsewhere than Linux/glibc nothing is done.

Must not: be imported by controller/core (process-wide state belongs to the edges).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TOP_PAD = -2  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TOP_PAD_BYTES = 64 << 20
ENV_SWITCH = "GOVERNOR_TUNE_MALLOC"


def tune_allocator(environ: dict[str, str] | None = None) -> bool:
    """Apply the settings; True if glibc accepted both, False if skipped or refused (nothing raised)."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no libc by that name, or a libc without mallopt (musl)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1  # mallopt returns 1 on success
    return mallopt(M_TOP_PAD, TOP_PAD_BYTES) == 1 and ok
