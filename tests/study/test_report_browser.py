"""teamrl report opened in a real browser (headless Chromium from the system packages)."""

from __future__ import annotations

import shutil
import struct

import pytest

from teamrl.study.report import write_report
from tests.study.chromium import Chromium, find_chromium
from tests.study.runs import fake_run

BINARY = find_chromium()
pytestmark = pytest.mark.skipif(BINARY is None, reason="no Chromium on PATH (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    b = Chromium(BINARY)
    yield b
    b.close()


def _report(tmp_path):
    for seed in range(2):
        fake_run(tmp_path / f"drmas_seed{seed}", "drmas", seed, [0.1 * seed, 0.3, 0.6], [1.0, 2.0 + seed, 1.5], 0.5, 0)
    fake_run(tmp_path / "grpo_seed0", "grpo", 0, [0.0, 0.1, 0.2], [3.0, 3.0, 3.0], 0.25, 1)
    return write_report([tmp_path / "drmas_seed0", tmp_path / "drmas_seed1", tmp_path / "grpo_seed0"], tmp_path / "out")


def test_report_renders_its_plots_and_table_without_errors(tmp_path, browser):
    page = browser.open(_report(tmp_path))
    assert page["errors"] == []
    assert sorted(src for src, _, _ in page["images"]) == ["amplification.png", "grad_norm.png", "reward.png"]
    assert all(complete and width > 0 for _, complete, width in page["images"]), page["images"]
    assert "drmas\t2\t0.500 ± 0.000" in page["text"] and "grpo\t1\t0.250" in page["text"]  # the table, as rendered
    assert "drmas − grpo\t1\tno grpo run for seed 1\t+0.250 (n=1: no interval)" in page["text"]  # the paired one
    png = page["png"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width == 1200 and height > 800  # the whole page: table and three plots below the fold
    (tmp_path / "out" / "screenshot.png").write_bytes(png)


def test_a_missing_plot_is_reported(tmp_path, browser):
    report = _report(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(report.parent, broken)
    (broken / "reward.png").unlink()
    page = browser.open(broken / "report.html")
    assert any("reward.png" in e or "ERR_FILE_NOT_FOUND" in e for e in page["errors"]), page["errors"]
    assert [(src, width) for src, _, width in page["images"] if width == 0] == [("reward.png", 0)]
