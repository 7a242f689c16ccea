"""Run model-written Python programs isolated from the machine, with limits, and get a verdict.

Contract (what callers may rely on):

* ``run_python(source, *, stdin=None, files=None, limits=None, sandbox=None) -> Run`` runs ``source``
  as ``/work/main.py`` (cwd ``/work``, an empty in-memory folder; ``files`` are copied beside it)
  on the sandbox's interpreter with the standard library only, and always returns; it never raises
  for anything the program does. ``Run.verdict`` is one of ``VERDICTS``: ``ok`` (exit 0),
  ``error`` (non-zero exit, e.g. an exception; ``stderr`` has the traceback), ``timeout`` (CPU or
  wall limit), ``memory`` (MemoryError under the memory limit), ``output_limit`` (more than
  ``Limits.output_bytes`` of stdout+stderr), ``killed`` (a signal: segfault, abort, ...);
  ``Run.stdout`` / ``Run.stderr`` are text, capped; ``Run.seconds`` / ``Run.cpu_seconds`` measured.
* ``Limits(cpu_seconds, wall_seconds, memory_bytes, processes, open_files, output_bytes,
  disk_bytes)`` bounds one run.
* ``Sandbox(mechanism="auto"|"bwrap"|"unsafe_no_isolation", python=None, workers=None)`` picks the
  mechanism once (``auto`` = bubblewrap, else :class:`SandboxUnavailable` naming the fix), logs it
  (``describe()``), self-tests, and runs up to ``workers`` programs at once: ``run(...)`` (blocking,
  thread-safe), ``submit(Job) -> Future[Run]``, ``map(jobs) -> list[Run]``. ``default_sandbox()``
  is one per process, from ``TEAMRL_SANDBOX`` / ``TEAMRL_SANDBOX_PYTHON``.

Isolation under ``bwrap``: no network, no view of host files beyond the interpreter, its standard
library and shared libraries (read-only), writes only to its own size-capped ``/work`` and
``/tmp``, its own PID namespace (cannot see or signal the trainer), no environment variables but
HOME/LANG/PATH, seccomp denying kernel-surface calls, rlimits for CPU, memory, processes, open files
and file size; the process limit holds per run as root and as a normal user, and a reaper per run
leaves no process or zombie behind whatever PID 1 is. ``teamrl sandbox-check`` (:mod:`teamrl.sandbox.check`)
shows what is contained where it runs. See docs/code.md for the containment table per setting and throughput.

Left out: test harnesses and verdicts of test suites (``teamrl.domains.code.code``).
"""

from teamrl.sandbox.run import VERDICTS, Limits, Run, trim
from teamrl.sandbox.sandbox import MECHANISMS, Job, Sandbox, SandboxUnavailable, default_sandbox, run_python

__all__ = ["MECHANISMS", "VERDICTS", "Job", "Limits", "Run", "Sandbox", "SandboxUnavailable", "default_sandbox",
           "run_python", "trim"]
