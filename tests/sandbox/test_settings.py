"""The sandbox where people run training: as a normal user, as PID 1 of a container, without user namespaces.

Each test runs ``python -m teamrl.sandbox.check`` (standard library only) in a fresh process in that
setting, from a world-readable copy of the package, and reads its ``RESULT`` line. Switching users and
making PID namespaces needs root, so these tests skip for a normal user; ``scripts/sandbox_settings.sh``
runs the whole table (docs/code.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from teamrl.sandbox.reaper import reaper_argv

ROOT = Path(__file__).resolve().parents[2]
USER = 1_999_999  # a uid no account has: a normal user as far as the kernel is concerned
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("bwrap", "unshare", "setpriv", "prlimit")),
    reason="switching to a normal user and making PID namespaces needs root, bubblewrap and util-linux")


@pytest.fixture(scope="module")
def tree():
    """A copy of the package any user can read (a checkout under /root is not)."""
    folder = tempfile.mkdtemp(prefix="teamrl-settings-")
    shutil.copytree(ROOT / "teamrl", Path(folder, "teamrl"), ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for path in [Path(folder), *Path(folder).rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder)


def _check(tree: str, *args: str, prefix: tuple[str, ...] = ()) -> tuple[int, str]:
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": tree}
    done = subprocess.run([*prefix, python, "-m", "teamrl.sandbox.check", *args], env=env, capture_output=True,
                          text=True, timeout=240)
    return done.returncode, done.stdout + done.stderr


def _result(output: str) -> dict[str, str]:
    line = next(x for x in output.splitlines() if x.startswith("RESULT name=sandbox_check"))
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def _share(field: str) -> float:
    ok, total = map(int, field.split("/"))
    return ok / total


AS_USER = ("setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups")
PID1 = ("unshare", "--pid", "--fork", "--mount-proc")


@needs_root
@pytest.mark.parametrize("pid1", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["session", "pid1"])
def test_a_fork_bomb_of_a_normal_user_leaves_the_user_able_to_start_processes(tree, pid1):
    """The user's processes capped at 512 (the bomb alone would take them all): while the bomb runs to its wall
    limit, the caller still starts processes and threads, and the runs leave no zombie."""
    cap = ("prlimit", "--nproc=512")
    rc, out = _check(tree, "--only", "fork_bomb", "thread_bomb", "--runs", "20",
                     prefix=(*PID1, *cap, *AS_USER) if pid1 else (*cap, *AS_USER))
    got = _result(out)
    assert rc == 0 and got["user"] == "normal" and got["pid1"] == str(int(pid1)), out
    assert got["process_limit"] == "userns" and "RLIMIT_NPROC in each run's user namespace" in out
    assert _share(got["fork_bomb_process_starts_ok"]) >= 0.9 and _share(got["thread_starts_ok"]) >= 0.9, out
    assert got["zombies_after"] == "0", out


@needs_root
def test_a_pid_1_that_never_reaps_is_left_no_zombie(tree):
    """As PID 1 of a new PID namespace (a container without --init): 100 runs, a daemon and a killed run leave
    nothing (each run's init used to stay a zombie: 101 after 100 runs)."""
    rc, out = _check(tree, "--only", "daemon", "sleep", "--runs", "100", prefix=PID1)
    got = _result(out)
    assert rc == 0 and got["pid1"] == "1" and got["contained"] == "2/2", out
    assert int(got["zombies_after"]) == 0, out


_NO_USERNS = textwrap.dedent("""
    import ctypes, os, sys
    uid, cmd = int(sys.argv[1]), sys.argv[2:]
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
            os._exit(90)
        os.write(w2, b"x")
        os.read(r, 1)
        open("/proc/sys/user/max_user_namespaces", "w").write("0")
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        os.execvp(cmd[0], cmd)
    os.read(r2, 1)
    for name in ("uid_map", "gid_map"):
        open(f"/proc/{pid}/{name}", "w").write("0 0 4294967295")
    os.write(w, b"x")
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""")


@needs_root
def test_without_user_namespaces_the_refusal_names_the_cause(tree):
    """max_user_namespaces = 0 in the user's own namespace (what Docker's default seccomp profile or the sysctl
    give): the sandbox refuses in one line naming user namespaces and the way out, with no traceback."""
    rc, out = _check(tree, "--runs", "0", prefix=(sys.executable, "-c", _NO_USERNS, str(USER)))
    assert rc == 3, out
    assert "refused: " in out and "bubblewrap cannot create user namespaces here" in out, out
    assert "unsafe_no_isolation" in out and "Traceback" not in out


def _reaper(*launcher: str) -> subprocess.Popen:
    return subprocess.Popen(reaper_argv(sys.executable, list(launcher), user=None), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("script", "code"), [("exit 3", 3), ("exit 0", 0), ("kill -SEGV $$", 128 + 11)])
def test_the_reaper_passes_the_launchers_status_through(script, code):
    proc = _reaper("/bin/sh", "-c", script)
    assert proc.wait(timeout=30) == code


def test_the_reaper_waits_for_the_orphans_it_adopts():
    """A launcher that leaves a background child: the reaper adopts it (subreaper) and exits only after it."""
    proc = _reaper("/bin/sh", "-c", "(sleep 0.3; echo orphan done) & echo launcher done")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.split() == ["launcher", "done", "orphan", "done"]


def test_sigterm_makes_the_reaper_kill_the_whole_run_and_reap_it():
    """The runner's stop at the wall limit: the launcher, its child and an orphan the reaper adopted are all
    gone (not even zombies) when the reaper exits."""
    proc = _reaper("/bin/sh", "-c", "sleep 60 & echo $!; (sleep 60 & echo $!); echo started; sleep 60")
    assert proc.stdout is not None
    pids = [int(proc.stdout.readline()) for _ in range(2)]
    assert proc.stdout.readline().strip() == "started"
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + 9  # the launcher died of SIGKILL
    assert [pid for pid in pids if os.path.exists(f"/proc/{pid}")] == []
