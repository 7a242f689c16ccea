"""What the sandbox contains where it runs now: ``teamrl sandbox-check`` (or ``python -m teamrl.sandbox.check``).

Runs each hostile program of :data:`HOSTILE` one at a time with the small limits :data:`FAST`, and
while each runs, tries from the calling process what a trainer does: start a process (``/bin/true``)
and a thread, every 20 ms. Then runs ``--runs`` trivial programs and counts the zombies this PID
namespace holds before and after. Prints the setting (user, PID 1 or not, the process caps in
force), the sandbox's own line (mechanism and process limit), a markdown table

    | program | verdict | expected | seconds | process starts ok | thread starts ok |

and one line to compare across settings::

    RESULT name=sandbox_check user=... pid1=... contained=22/22 process_starts_ok=... thread_starts_ok=...
      fork_bomb_process_starts_ok=... zombies_before=... zombies_after=... runs=...

Standard library only, so it also runs on a system Python as any user
(``PYTHONPATH=/path/to/teamrl python3 -m teamrl.sandbox.check``); ``scripts/sandbox_settings.sh`` runs
it as root, as a normal user in a process-capped cgroup, as PID 1 of a new PID namespace, and where
user namespaces are unavailable (docs/code.md has the table).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import pwd
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from teamrl.sandbox.run import Limits, Run
from teamrl.sandbox.sandbox import Job, Sandbox, SandboxUnavailable, process_states

__all__ = ["EXPECTED", "FAST", "Probes", "hostile_programs", "main", "zombies"]

FAST = Limits(cpu_seconds=1, wall_seconds=3, memory_bytes=256 * 2**20, processes=8, output_bytes=64 * 1024,
              disk_bytes=1 << 20)
"""The limits the hostile programs run under (1 s CPU, 3 s wall, 256 MiB, 8 processes, 64 KiB output, 1 MiB disk)."""


def hostile_programs(secret_file: str, port: int, trainer_pid: int) -> dict[str, str]:
    """Programs that each try one escape: name -> source.

    Args:
        secret_file: A host file the programs must not read or write beside.
        port: A port listening on the host's loopback, which they must not reach.
        trainer_pid: A pid of the caller's (its own, or a child's), which they must not signal.
    """
    return {
        "network_out": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",
        "network_host_port": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
        "write_outside": "open('/usr/lib/teamrl_pwned', 'w').write('x')",
        "write_host_path": f"open({secret_file + '.pwned'!r}, 'w').write('x')",
        "read_host_file": f"print(open({secret_file!r}).read())",
        "read_etc_passwd": "print(open('/etc/passwd').read())",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "thread_bomb": "import threading, time\nfor _ in range(10000):\n"
                       "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
        "memory_bomb": "x = []\nwhile True:\n    x.append(bytes(10**7))",  # calloc: grows fast on a loaded machine
        "busy_loop": "while True:\n    pass",
        "busy_loop_ignoring_sigxcpu": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n"
                                      "    pass",
        "sleep": "import time\ntime.sleep(60)",
        "kill_parent": "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntry:\n"
                       "    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    print('nothing else to kill')\n"
                       "time.sleep(0.2)\nprint('alive')",
        "signal_trainer": f"import os\nos.kill({trainer_pid}, 0)",
        "huge_output": "while True:\n    print('x' * 10000)",
        "abort": "import os\nos.abort()",
        "segfault": "import ctypes\nctypes.string_at(0)",
        "environment": "import os\nprint(dict(os.environ))\nprint(open('/proc/1/environ').read())",
        "fill_disk": "open('big', 'wb').write(b'x' * (8 << 20))",
        "ptrace_seccomp": "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                          "r = libc.syscall(101, 0, 0, 0, 0)\nprint(r, os.strerror(ctypes.get_errno()))",
        "see_processes": "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
        "list_root": "import os\nprint(sorted(os.listdir('/')))",
        "daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                  "        time.sleep(60)\n    os._exit(0)\nprint('left a daemon')",
    }


EXPECTED = {  # name -> verdict
    "network_out": "error", "network_host_port": "error", "write_outside": "error", "write_host_path": "error",
    "read_host_file": "error", "read_etc_passwd": "error", "fork_bomb": "timeout", "thread_bomb": "error",
    "memory_bomb": "memory", "busy_loop": "timeout", "busy_loop_ignoring_sigxcpu": "timeout", "sleep": "timeout",
    "kill_parent": "ok", "signal_trainer": "error", "huge_output": "output_limit", "abort": "killed",
    "segfault": "killed", "environment": "ok", "fill_disk": "error", "ptrace_seccomp": "ok", "see_processes": "ok",
    "list_root": "ok", "daemon": "ok",
}
"""The verdict each hostile program must get."""


def zombies() -> int:
    """Zombie processes in this PID namespace."""
    return sum(state == b"Z" for _, state in process_states())


@dataclass
class Probes:
    """How many process and thread starts the caller tried while a run was in flight, and how many worked."""

    processes_ok: int = 0
    processes: int = 0
    threads_ok: int = 0
    threads: int = 0

    def add(self, other: Probes) -> None:
        for key in ("processes_ok", "processes", "threads_ok", "threads"):
            setattr(self, key, getattr(self, key) + getattr(other, key))


def _start_process() -> bool:
    try:
        pid = os.posix_spawn("/bin/true", ["true"], {})
    except OSError:
        return False
    os.waitpid(pid, 0)
    return True


def _start_thread() -> bool:
    try:
        thread = threading.Thread(target=lambda: None)
        thread.start()
    except RuntimeError:
        return False
    thread.join()
    return True


def probe_while(run: Callable[[], Run], every: float = 0.02) -> tuple[Run, Probes]:
    """``run()`` in a thread while this thread tries to start a process and a thread every ``every`` seconds."""
    done: list[Run] = []
    probes = Probes()
    worker = threading.Thread(target=lambda: done.append(run()))
    while True:  # where an earlier run's processes still take every slot, this start is refused too
        try:
            worker.start()
            break
        except RuntimeError:
            probes.threads += 1
            time.sleep(every)
    while worker.is_alive():
        time.sleep(every)
        probes.processes += 1
        probes.processes_ok += _start_process()
        probes.threads += 1
        probes.threads_ok += _start_thread()
    worker.join()
    return done[0], probes


def setting() -> str:
    """The user, PID 1 or not, and the process caps in force on this process."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    parts = [f"user {name} ({'root' if uid == 0 else 'not root'})", f"pid {os.getpid()}"
             + (" (PID 1 of its namespace)" if os.getpid() == 1 else ""),
             f"RLIMIT_NPROC {'unlimited' if soft == resource.RLIM_INFINITY else soft}"]
    cap = _cgroup_pids_max()
    if cap:
        parts.append(f"cgroup pids.max {cap}")
    parts.append(f"kernel {os.uname().release}")
    return ", ".join(parts)


def _cgroup_pids_max() -> str | None:
    """pids.max of this process's cgroup (v2 or v1's pids controller), None if none is readable or set."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for folder in ([f"/sys/fs/cgroup{path}", f"/sys/fs/cgroup/unified{path}"] if controllers == ""
                       else [f"/sys/fs/cgroup/pids{path}"] if "pids" in controllers.split(",") else []):
            try:
                value = Path(folder, "pids.max").read_text().strip()
            except OSError:
                continue
            if value != "max":
                return value
    return None


@contextlib.contextmanager
def _bystander() -> Iterator[int]:
    """The pid of a process of the caller's (a sleeping child) for ``signal_trainer`` to aim at.

    Not the caller's own pid: as PID 1 of a container that is 1, which inside the sandbox names its own init.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        while not procs or procs[-1].pid <= 3:  # the sandbox's own pids are 1 to 3
            procs.append(subprocess.Popen(["sleep", "3600"]))
        yield procs[-1].pid
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="teamrl sandbox-check", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="trivial runs whose leftover zombies are counted")
    parser.add_argument("--only", nargs="*", default=None, metavar="PROGRAM", help="run only these hostile programs")
    parser.add_argument("--mechanism", default="auto", help="sandbox mechanism (auto, bwrap, unsafe_no_isolation)")
    args = parser.parse_args(argv)
    print(f"setting: {setting()}")
    before = zombies()
    try:
        box = Sandbox(mechanism=args.mechanism, workers=1)
    except SandboxUnavailable as exc:
        print(f"refused: {exc}")
        print(f"RESULT name=sandbox_check user={'root' if os.geteuid() == 0 else 'normal'} "
              f"pid1={int(os.getpid() == 1)} refused=1")
        return 3
    print(box.describe())
    names = args.only or list(EXPECTED)
    unknown = sorted(set(names) - set(EXPECTED))
    if unknown:
        parser.error(f"unknown hostile programs {unknown}; known: {', '.join(EXPECTED)}")
    print("| program | verdict | expected | seconds | process starts ok | thread starts ok |\n"
          "| --- | --- | --- | --- | --- | --- |")
    total, bomb = Probes(), Probes()
    contained = 0
    with tempfile.TemporaryDirectory() as folder, socket.socket() as server, _bystander() as bystander:
        secret = Path(folder, "secret.txt")
        secret.write_text("host secret")
        server.bind(("127.0.0.1", 0))
        server.listen()
        programs = hostile_programs(str(secret), server.getsockname()[1], bystander)
        for name in names:
            run, probes = probe_while(functools.partial(box.run, programs[name], limits=FAST))
            contained += run.verdict == EXPECTED[name]
            total.add(probes)
            if name == "fork_bomb":
                bomb = probes
            print(f"| {name} | {run.verdict} | {EXPECTED[name]} | {run.seconds:.2f} | "
                  f"{probes.processes_ok}/{probes.processes} | {probes.threads_ok}/{probes.threads} |", flush=True)
    box.map(Job("pass") for _ in range(args.runs))
    time.sleep(0.5)  # what a run leaves exits within ms; give a loaded machine time before counting
    after = zombies()
    print(f"zombies in this PID namespace: {before} before the sandbox, {after} after {len(names)} hostile and "
          f"{args.runs} trivial runs")
    box.close()
    user = "root" if os.geteuid() == 0 else "normal"
    print(f"RESULT name=sandbox_check user={user} pid1={int(os.getpid() == 1)} process_limit={box.process_limit} "
          f"contained={contained}/{len(names)} process_starts_ok={total.processes_ok}/{total.processes} "
          f"thread_starts_ok={total.threads_ok}/{total.threads} "
          f"fork_bomb_process_starts_ok={bomb.processes_ok}/{bomb.processes} zombies_before={before} "
          f"zombies_after={after} runs={args.runs}")
    return 0 if contained == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
