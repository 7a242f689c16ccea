"""Containment: each escape a hostile program tries is contained, with its verdict, within its limits.

All hostile programs run at once on one sandbox (small limits), so the file takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import socket
import textwrap
import time

import pytest

from teamrl.sandbox import Job, Limits, Sandbox, SandboxUnavailable, run_python
from teamrl.sandbox.check import EXPECTED, FAST, hostile_programs
from tests.conftest import HANG_S

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install bubblewrap; scripts/setup.sh)")

# How long past its wall limit a verdict may come: a hang guard only. That each limit held is what the verdict says
# (``timeout``: the run was stopped at its wall limit); a loaded machine can delay the kill and the reaping by seconds.
MARGIN = HANG_S


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(workers=6)
    yield box
    box.close()


@pytest.fixture(scope="module")
def hostile(sandbox, tmp_path_factory):
    secret = tmp_path_factory.mktemp("host") / "secret.txt"
    secret.write_text("host secret")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    os.environ["TEAMRL_TEST_SECRET"] = "trainer-secret-value"
    try:
        programs = hostile_programs(str(secret), server.getsockname()[1], os.getpid())
        runs = sandbox.map(Job(src, limits=FAST) for src in programs.values())
    finally:
        server.close()
        del os.environ["TEAMRL_TEST_SECRET"]
    return dict(zip(programs, runs, strict=True)), secret


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_hostile_program_gets_its_verdict_within_its_limit(hostile, name):
    runs, _ = hostile
    run = runs[name]
    assert run.verdict == EXPECTED[name], (name, run)
    assert run.seconds <= FAST.wall_seconds + MARGIN, (name, run.seconds)


def test_what_the_hostile_programs_saw(hostile):
    runs, secret = hostile
    assert "Network is unreachable" in runs["network_out"].stderr
    assert "ConnectionRefused" in runs["network_host_port"].stderr  # its own loopback, not the host's
    assert not os.path.exists("/usr/lib/teamrl_pwned") and not os.path.exists(str(secret) + ".pwned")
    assert "FileNotFoundError" in runs["read_host_file"].stderr and "host secret" not in runs["read_host_file"].stdout
    assert "FileNotFoundError" in runs["read_etc_passwd"].stderr
    # init ignores the signal; nothing else of the machine is in its namespace
    assert runs["kill_parent"].stdout.split("\n")[:2] == ["nothing else to kill", "alive"]
    assert "can't start new thread" in runs["thread_bomb"].stderr
    assert "ProcessLookupError" in runs["signal_trainer"].stderr
    env = runs["environment"].stdout
    assert "trainer-secret-value" not in env and "TEAMRL" not in env and "'HOME': '/work'" in env
    assert len(runs["huge_output"].stdout) <= FAST.output_bytes
    assert "OSError" in runs["fill_disk"].stderr  # ENOSPC / EFBIG: the 1 MiB folder is full
    assert runs["ptrace_seccomp"].stdout.split()[0] == "-1" and "not permitted" in runs["ptrace_seccomp"].stdout
    assert runs["see_processes"].stdout.strip() in ("[1, 2]", "[1, 2, 3]")  # bwrap's init and itself only
    assert runs["list_root"].stdout.strip() == "['dev', 'lib', 'lib64', 'proc', 'tmp', 'usr', 'work']"
    assert runs["daemon"].stdout.strip() == "left a daemon"  # and it died with the run (next test)


def test_no_process_of_a_run_outlives_it(hostile, sandbox):
    """Every run's processes are gone when its verdict is out (the fork bomb's and the daemon's too), not even
    left as zombies: each run's reaper reaps all of them. As root, this sandbox's runs have host users of
    their own (other sandboxes on the machine have others); tests/sandbox/test_settings.py counts zombies in a
    PID namespace of their own as root and as a normal user."""
    if not sandbox.uid_range:
        pytest.skip("runs keep the caller's user when it is not root; test_settings.py covers that case")
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            state = open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
            name = open(f"/proc/{pid}/comm").read().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if uid in sandbox.uid_range:  # alive or a zombie (bubblewrap's namespace init used to stay one)
            left.append((pid, uid, state, name))
    assert left == []


def test_runs_go_in_parallel_and_the_caller_keeps_running(sandbox):
    start = time.monotonic()
    program = "import time\nstart = time.time()\ntime.sleep(1)\nprint(start, time.time())"
    runs = sandbox.map(Job(program, limits=FAST) for _ in range(6))
    assert [r.verdict for r in runs] == ["ok"] * 6
    spans = [tuple(map(float, r.stdout.split())) for r in runs]  # the realtime clock is the host's in the sandbox
    overlapping = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert overlapping >= 2  # 6 x 1 s on 6 workers side by side; in a row, no two runs' spans would overlap
    assert time.monotonic() - start < HANG_S


def test_stdin_and_files_reach_the_program(sandbox):
    run = sandbox.run("import sys\nprint(sys.stdin.read().upper(), open('data/x.txt').read())",
                      stdin="abc", files={"data/x.txt": "file"}, limits=FAST)
    assert (run.verdict, run.stdout.strip()) == ("ok", "ABC file")
    run_default = run_python("print(sum(range(10)))", sandbox=sandbox)
    assert run_default.stdout.strip() == "45"


def test_a_file_name_leaving_the_folder_is_refused(sandbox):
    with pytest.raises(ValueError, match="relative path"):
        sandbox.run("pass", files={"../x": "y"})


def test_no_bubblewrap_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else f"/usr/bin/{name}")
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Sandbox()


def test_the_unsafe_mode_runs_only_by_name_and_warns(caplog):
    with pytest.raises(ValueError, match="unknown sandbox mechanism 'unsafe'.*unsafe_no_isolation"):
        Sandbox(mechanism="unsafe")
    box = Sandbox(mechanism="unsafe_no_isolation", workers=1)
    assert "SANDBOX DISABLED" in caplog.text
    run = box.run(textwrap.dedent("""
        import os
        print(os.getcwd().startswith('/tmp'), dict(os.environ))
    """), limits=FAST)
    assert (run.verdict, run.stdout.split(" ")[0]) == ("ok", "True")
    assert box.run("while True: pass", limits=Limits(cpu_seconds=1, wall_seconds=1)).verdict == "timeout"
    box.close()
