"""Verdicts from exit statuses, limits validation and trimming (no sandbox needed)."""

from __future__ import annotations

import signal

import pytest

from teamrl.sandbox.run import Limits, trim, verdict_of

L = Limits(cpu_seconds=2)


@pytest.mark.parametrize(("code", "stderr", "seconds", "flags", "verdict"), [
    (0, "", 0.1, {}, "ok"),
    (1, "Traceback\nValueError: x", 0.1, {}, "error"),
    (1, "Traceback\nMemoryError", 0.1, {}, "memory"),
    (128 + signal.SIGXCPU, "", 2.0, {}, "timeout"),
    (128 + signal.SIGKILL, "", 3.1, {}, "timeout"),   # the hard CPU limit, SIGXCPU ignored
    (128 + signal.SIGKILL, "", 0.2, {}, "killed"),    # killed itself long before the CPU limit
    (128 + signal.SIGSEGV, "", 0.1, {}, "killed"),
    (-signal.SIGABRT, "", 0.1, {}, "killed"),
    (0, "", 0.1, {"timed_out": True}, "timeout"),
    (0, "", 0.1, {"over_output": True, "timed_out": True}, "output_limit"),
])
def test_verdict_of(code, stderr, seconds, flags, verdict):
    kwargs = {"timed_out": False, "over_output": False, **flags}
    assert verdict_of(code, stderr, seconds=seconds, limits=L, **kwargs) == verdict


def test_limits_are_checked():
    for bad in ({"cpu_seconds": 0}, {"wall_seconds": -1}, {"memory_bytes": 2**20}, {"open_files": 3},
                {"processes": 0}, {"output_bytes": 1.5}):
        with pytest.raises(ValueError, match="Limits\\."):
            Limits(**bad)


def test_trim_keeps_head_and_tail():
    text = "a" * 50 + "b" * 50
    out = trim(text, 20)
    assert out.startswith("a" * 10) and out.endswith("b" * 10) and "80 characters cut" in out
    assert trim("short", 20) == "short"
