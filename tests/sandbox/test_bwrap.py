"""The sandbox's command line and seccomp program: what is mounted, unshared and limited."""

from __future__ import annotations

import os
import shutil
import struct

import pytest

from teamrl.sandbox.bwrap import launcher_argv, probe_interpreter, rlimit_args
from teamrl.sandbox.run import Limits
from teamrl.sandbox.seccomp import DENIED_X86_64, filter_bytes


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no /usr/bin/python3")
def test_only_the_interpreter_its_library_and_shared_libraries_are_mounted():
    interp = probe_interpreter("/usr/bin/python3")
    argv = launcher_argv(interp, Limits(processes=4, disk_bytes=2**20), files={"main.py": 5}, args=["main.py"],
                         seccomp_fd=6, bwrap="bwrap")
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--ro-bind", "--bind")]
    assert "--bind" not in argv  # nothing of the host is writable
    for host in binds:
        assert host == interp.executable or "python3" in host or host.startswith(("/usr/lib", "/lib")), host
    assert not any(h.startswith(("/work", "/root", "/home", "/etc")) for h in binds)
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv"):
        assert flag in argv
    assert argv[argv.index("--seccomp") + 1] == "6" and argv[argv.index("/tmp") - 2:argv.index("/tmp")] == ["1048576", "--tmpfs"]
    assert argv[-5:] == [interp.executable, "-E", "-s", "-B", "main.py"]
    assert rlimit_args(Limits(processes=4, disk_bytes=2**20), processes=True)[-2:] == ["--core=0", "--nproc=7"]
    inside = launcher_argv(interp, Limits(processes=4), files={"main.py": 5}, args=["main.py"], seccomp_fd=None,
                           bwrap="bwrap", inside_nproc=6)
    assert inside[-8:] == ["/usr/bin/prlimit", "--nproc=6", "--", interp.executable, "-E", "-s", "-B", "main.py"]
    i = inside.index("/usr/bin/prlimit")
    assert inside[i - 1:i + 2] == ["--ro-bind", "/usr/bin/prlimit", "/usr/bin/prlimit"]  # read-only at its path


def test_the_seccomp_program_denies_each_listed_call_and_checks_the_architecture():
    prog = filter_bytes("x86_64")
    insns = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    assert insns[0] == (0x20, 0, 0, 4) and insns[1][3] == 0xC000003E  # load arch, compare with x86_64
    jeqs = [(i, k, jt) for i, (code, jt, _, k) in enumerate(insns) if code == 0x15 and i > 1]
    assert sorted(k for _, k, _ in jeqs) == sorted(DENIED_X86_64.values())
    errno_at = len(insns) - 1
    assert insns[errno_at] == (0x06, 0, 0, 0x00050001) and insns[errno_at - 1] == (0x06, 0, 0, 0x7FFF0000)
    for i, _, jt in jeqs:
        assert i + 1 + jt == errno_at  # every match jumps to the EPERM return


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_an_allowed_call_still_works_under_the_filter():
    from teamrl.sandbox import Sandbox
    box = Sandbox(workers=1)
    run = box.run("import os, threading\nt = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()\n"
                  "print(os.getpid())")
    assert (run.verdict, run.stdout.split()) == ("ok", ["thread", "2"])
    box.close()
