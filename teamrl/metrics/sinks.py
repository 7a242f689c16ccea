"""Where metrics go: ``metrics.jsonl`` (one JSON object per step) and TensorBoard events."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsSink:
    """Appends each step's metrics to ``metrics.jsonl`` and to TensorBoard (when installed)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:  # tensorboard is a dependency, but a broken install must not stop training
            log.warning("tensorboard is not importable; metrics go to metrics.jsonl only")

    def write(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                if math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows to a JSON-lines file."""
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
