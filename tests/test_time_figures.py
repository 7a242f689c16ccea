"""The quickstart's time figure in the README, the config's header and docs/quickstart.md is the measured range of
docs/results/results.jsonl (the whole command's wall time on each machine), not a number written by hand."""

from __future__ import annotations

import json
import math
import re

from tests.conftest import REPO

PLACES = ("README.md", "configs/quickstart.yaml", "docs/quickstart.md")


def measured_range() -> str:
    """``"A-B minutes"``: the fastest and slowest whole quickstart run recorded, in whole minutes (down, up)."""
    rows = [json.loads(line) for line in (REPO / "docs" / "results" / "results.jsonl").read_text().splitlines()]
    walls = [float(r["value"]) for r in rows if r["page"] == "quickstart" and r["key"] == "wall_s"
             and r["command"].endswith("teamrl train configs/quickstart.yaml")]  # the command as shipped, whole
    assert len(walls) >= 3
    return f"{math.floor(min(walls) / 60)}-{math.ceil(max(walls) / 60)} minutes"


def test_every_quickstart_time_figure_is_the_measured_range():
    expected = measured_range()
    for place in PLACES:
        text = (REPO / place).read_text()
        found = re.findall(r"\b(\d+-\d+ minutes)", text)
        assert found and set(found) == {expected}, f"{place}: {found}, the data says {expected}"
