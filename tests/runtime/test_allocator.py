"""The allocator settings the CLI applies at start (controller/runtime/allocator.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from controller.runtime.allocator import ENV_SWITCH, tune_allocator


@pytest.mark.parametrize("value", ["0", "false", "off", " No "])
def test_switched_off_by_the_environment(value):
    assert tune_allocator({ENV_SWITCH: value}) is False


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt settings are glibc's")
def test_glibc_accepts_the_settings_and_numpy_still_works():
    # in a child process: the settings are process-wide and must not leak into the test session
    code = ("from controller.runtime.allocator import tune_allocator\n"
            "import numpy as np\n"
            "ok = tune_allocator({})\n"
            "a = [np.ones(200_000) * k for k in range(50)]\n"  # 1.6 MB blocks, now from the heap
            "del a[::2]\n"
            "b = np.ones(3_000_000).sum()\n"
            "print(ok, b)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "3000000.0"]
