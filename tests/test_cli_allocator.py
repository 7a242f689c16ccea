"""``--allocator``: ``teamrl train`` restarts itself with tcmalloc preloaded unless told ``system``.

Seen from inside the process: an ``--import`` file records the ``LD_PRELOAD`` the command runs under.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from teamrl.cli import _TCMALLOC
from tests.conftest import REPO

TCMALLOC = next((p for p in _TCMALLOC if os.path.exists(p)), None)


def _preload_seen(tmp_path: Path, *options: str) -> str:
    seen = tmp_path / "preload.txt"
    probe = tmp_path / "probe.py"
    probe.write_text(f"import os\nopen({str(seen)!r}, 'w').write(os.environ.get('LD_PRELOAD', ''))\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run([sys.executable, "-m", "teamrl.cli", "train", "quickstart", "--dry-run", "--import", str(probe),
                           *options], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return seen.read_text()


@pytest.mark.skipif(TCMALLOC is None, reason="libtcmalloc is not installed (scripts/setup.sh installs it on Debian)")
def test_tcmalloc_is_preloaded_by_default(tmp_path: Path) -> None:
    assert TCMALLOC in _preload_seen(tmp_path)


def test_allocator_system_keeps_glibc_malloc(tmp_path: Path) -> None:
    assert "tcmalloc" not in _preload_seen(tmp_path, "--allocator", "system")


def test_an_unknown_allocator_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "teamrl.cli", "train", "quickstart", "--dry-run", "--allocator", "jemalloc"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "invalid choice: 'jemalloc'" in done.stderr and "Traceback" not in done.stderr
