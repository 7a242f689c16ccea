"""A subreaper per run: nothing a sandboxed run leaves behind outlives it, whatever PID 1 does.

bubblewrap's monitor returns as soon as the program's exit status arrives and does not wait for the
init of the run's PID namespace, which then exits as an orphan. The kernel hands an orphan to the
nearest ancestor marked as a child subreaper, else to PID 1 of its PID namespace: on a machine that
is the system's init, which reaps it; as PID 1 of a container (``docker run`` without ``--init``, many
Kubernetes pods) that is often the trainer itself or a shell that never reaps, and every run would
leave one zombie until the container's pids limit stops all process starts.

So each run's launcher starts under a small Python process of its own (:data:`REAPER`, run with the
sandbox's interpreter as ``python -I -S -c REAPER UID NICE RLIMITS... -- ARGV...``) that:

* marks itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so every orphan of the run
  comes to it and not to PID 1 or the trainer;
* starts the launcher in a process group of its own, as host user ``UID`` when one is given (root's
  per-run users; ``-`` keeps its own), under the run's rlimits and at its niceness (what ``prlimit``
  and ``nice`` would do, without their two extra program starts), with the signals Python ignores
  (SIGPIPE, SIGXFSZ) back at their defaults, as ``subprocess`` does;
* reaps every child until none is left, and exits with the launcher's status (``128 + s`` for a
  signal ``s``);
* on SIGTERM (the runner's wall-time or output limit) kills the launcher's group and every child it
  holds, then goes on reaping, so a killed run leaves nothing either.

The trainer waits only for this process, its own child; it never calls ``wait`` on anything else, so
no other library's children are touched.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["REAPER", "reaper_argv"]

REAPER = r"""
import ctypes, os, resource, signal, sys
uid, nice, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cut = rest.index('--')
rlimits, cmd = [a[2:].split('=') for a in rest[:cut]], rest[cut + 1:]
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.stderr.write('teamrl sandbox: prctl(PR_SET_CHILD_SUBREAPER) failed: %s\n' % os.strerror(ctypes.get_errno()))
child, stopping = 0, []

def children():
    found = []
    for task in os.listdir('/proc/self/task'):
        try:
            with open('/proc/self/task/%s/children' % task) as fh:
                found += [int(p) for p in fh.read().split()]
        except OSError:
            pass
    return found

def stop(*_):
    stopping.append(1)
    if not child:  # the forked child before its exec, or no child yet
        return
    for target, kill in ((child, os.killpg), *((p, os.kill) for p in children())):
        try:
            kill(target, signal.SIGKILL)
        except OSError:
            pass

signal.signal(signal.SIGTERM, stop)
child = os.fork()
if child == 0:
    try:
        os.setpgid(0, 0)
        for s in ('SIGTERM', 'SIGPIPE', 'SIGXFSZ'):
            signal.signal(getattr(signal, s), signal.SIG_DFL)
        if uid != '-':
            os.setgroups([])
            os.setgid(int(uid))
            os.setuid(int(uid))
        for name, value in rlimits:
            soft, _, hard = value.partition(':')
            resource.setrlimit(getattr(resource, 'RLIMIT_' + name.upper()), (int(soft), int(hard or soft)))
        if nice:
            os.nice(nice)
        os.execv(cmd[0], cmd)
    except BaseException as exc:
        sys.stderr.write('teamrl sandbox: cannot start %s: %s\n' % (cmd[0], exc))
    os._exit(127)
try:
    os.setpgid(child, child)
except OSError:
    pass
if stopping:
    stop()
status = None
while True:
    try:
        pid, raw = os.wait()
    except ChildProcessError:
        break
    if pid == child:
        status = raw
if status is None:
    os._exit(255)
os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""
"""The reaper's program (``argv``: the host uid or ``-``, the niceness to add, ``prlimit``-style
``--name=soft[:hard]`` options, ``--``, then the launcher's command line)."""


def reaper_argv(python: str, launcher: Sequence[str], *, user: int | None, nice: int = 0,
                rlimits: Sequence[str] = ()) -> list[str]:
    """The command line that runs ``launcher`` under a per-run subreaper.

    Args:
        python: An interpreter the runner may execute (the sandbox's).
        launcher: The run's command line (absolute path first).
        user: Host uid the launcher runs as (root's per-run users), None for the caller's own.
        nice: Niceness added before the launcher starts.
        rlimits: Its rlimits as ``prlimit`` options (``--cpu=3:4``, ``--as=268435456``; see
            :func:`teamrl.sandbox.bwrap.rlimit_args`), set after the user change.

    >>> reaper_argv("/usr/bin/python3", ["/usr/bin/bwrap", "x"], user=None)[:4] + ["..."]
    ['/usr/bin/python3', '-I', '-S', '-c', '...']
    >>> reaper_argv("/usr/bin/python3", ["/usr/bin/bwrap", "x"], user=2000000, nice=10, rlimits=["--core=0"])[5:]
    ['2000000', '10', '--core=0', '--', '/usr/bin/bwrap', 'x']
    """
    return [python, "-I", "-S", "-c", REAPER, "-" if user is None else str(user), str(nice), *rlimits, "--",
            *launcher]
