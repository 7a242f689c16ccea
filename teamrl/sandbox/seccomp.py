"""A seccomp filter (classic BPF, as bubblewrap's ``--seccomp FD`` loads it) that refuses dangerous system calls.

The filter is written out as the raw ``struct sock_filter`` array the kernel takes: it kills a
process that calls in through another ABI (i386 ``int 0x80``, x32), answers EPERM to the calls in
:data:`DENIED_X86_64` (kernel modules, mounts, namespaces, ptrace and reading other processes'
memory, keyrings, BPF, perf, userfaultfd, io_uring, reboot, swap, kexec, accounting, handles to
host files) and allows everything else. The namespaces and limits are the main wall; this removes
the kernel surface an exploit would use to climb over it.

Left out: architectures other than x86_64 (:func:`filter_bytes` returns None and the sandbox logs
that it runs without seccomp) and argument filtering (e.g. ``clone`` flags; the user namespace is
already closed to new namespaces by ``--disable-userns``).
"""

from __future__ import annotations

import platform
import struct

__all__ = ["DENIED_X86_64", "filter_bytes"]

DENIED_X86_64: dict[str, int] = {
    "ptrace": 101, "personality": 135, "acct": 163, "mount": 165, "umount2": 166, "pivot_root": 155,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
    "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442,
}
"""System calls answered with EPERM on x86_64, by name (numbers from the kernel's syscall_64.tbl)."""

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM = 1


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_bytes(machine: str | None = None) -> bytes | None:
    """The filter program for this machine, or None where there is none (not x86_64).

    Args:
        machine: ``platform.machine()`` to build for; None: this machine's.

    Returns:
        Packed ``struct sock_filter`` entries (8 bytes each), ready to hand to ``bwrap --seccomp``.

    >>> len(filter_bytes("x86_64")) // 8 == 4 + len(DENIED_X86_64) + 3
    True
    >>> filter_bytes("aarch64") is None
    True
    """
    if (machine or platform.machine()) not in ("x86_64", "AMD64"):
        return None
    numbers = sorted(DENIED_X86_64.values())
    n = len(numbers)
    # Layout: 0 load arch; 1 arch ok? skip kill; 2 kill; 3 load nr; 4 x32 bit -> errno;
    # 5..5+n-1 one JEQ each -> errno; then allow; errno.
    prog = [
        _insn(_LD_W_ABS, 4),                                   # A = seccomp_data.arch
        _insn(_JEQ_K, _AUDIT_ARCH_X86_64, jt=1, jf=0),         # x86_64: skip the kill
        _insn(_RET_K, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0),                                   # A = seccomp_data.nr
        _insn(_JGE_K, _X32_SYSCALL_BIT, jt=n + 1, jf=0),       # x32 ABI -> errno
    ]
    for i, nr in enumerate(numbers):
        prog.append(_insn(_JEQ_K, nr, jt=n - i, jf=0))         # -> errno (past the rest and allow)
    prog.append(_insn(_RET_K, _RET_ALLOW))
    prog.append(_insn(_RET_K, _RET_ERRNO | _EPERM))
    return b"".join(prog)
