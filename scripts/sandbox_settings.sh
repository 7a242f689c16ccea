#!/usr/bin/env bash
# The sandbox's containment check (python -m teamrl.sandbox.check) in each setting people train in, as root:
#   1. root;
#   2. a normal user whose processes are capped at 4,096 by a pids cgroup (a workstation session);
#   3. root as PID 1 of a new PID namespace that never reaps (a container without --init);
#   4. the normal user as PID 1, capped as in 2;
#   5. the normal user where user namespaces are unavailable (max_user_namespaces = 0 in its own user
#      namespace: what Docker's default seccomp profile or sysctl user.max_user_namespaces=0 give).
#   bash scripts/sandbox_settings.sh [--runs N] [--only PROGRAM ...]     (docs/code.md, "Containment per setting")
# Uses /usr/bin/python3 (the check needs the standard library only) with this tree on PYTHONPATH; creates the
# system user teamrl-check (no home, no login) if it does not exist, and the cgroup teamrl-check (removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: it switches to a normal user and makes a cgroup and PID namespaces" >&2; exit 2; }
tree=$(pwd)
py=${PYTHON:-/usr/bin/python3}
user=teamrl-check
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
uid=$(id -u "$user")
# the tree must be readable by that user (a clone under /root is not): copy the package where it is
if ! setpriv --reuid="$uid" --regid="$uid" --clear-groups test -r "$tree/teamrl/sandbox/check.py"; then
  copy=$(mktemp -d /tmp/teamrl-check-tree.XXXXXX); chmod 755 "$copy"
  cp -r teamrl "$copy/"; chmod -R a+rX "$copy"; tree=$copy
fi
cg=""
for base in /sys/fs/cgroup/pids /sys/fs/cgroup /sys/fs/cgroup/unified; do  # cgroup v1's pids hierarchy, or v2
  if [ -w "$base" ] && mkdir -p "$base/teamrl-check" 2>/dev/null; then
    if [ -f "$base/teamrl-check/pids.max" ] && echo 4096 > "$base/teamrl-check/pids.max"; then cg="$base/teamrl-check"; break; fi
    rmdir "$base/teamrl-check" 2>/dev/null || true
  fi
done
[ -n "$cg" ] || echo "note: no writable pids cgroup here; the normal user runs with RLIMIT_NPROC 4096 instead"
cleanup() { [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true; [ "${copy:-}" ] && rm -rf "$copy"; }
trap cleanup EXIT
check=(env -i PATH=/usr/bin:/bin HOME=/tmp PYTHONPATH="$tree" "$py" -m teamrl.sandbox.check "$@")
as_user=(setpriv --reuid="$uid" --regid="$uid" --clear-groups)
capped() {  # run "$@" inside the capped cgroup (or under RLIMIT_NPROC 4096 without one)
  if [ -n "$cg" ]; then sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"; else prlimit --nproc=4096 -- "$@"; fi
}
echo "### 1. root"
"${check[@]}" || true
echo; echo "### 2. normal user ($user), processes capped at 4096"
capped "${as_user[@]}" "${check[@]}" || true
echo; echo "### 3. root as PID 1 of a PID namespace that does not reap"
unshare --pid --fork --mount-proc "${check[@]}" || true
echo; echo "### 4. normal user as PID 1, processes capped at 4096"
capped unshare --pid --fork --mount-proc "${as_user[@]}" "${check[@]}" || true
echo; echo "### 5. normal user without user namespaces (max_user_namespaces = 0 in its own user namespace)"
"$py" - "$uid" "${check[@]}" <<'EOF' || true
import ctypes, os, sys
uid, cmd = int(sys.argv[1]), sys.argv[2:]
r, w = os.pipe()
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:  # a user namespace mapping every host id to itself, in which no further user namespace may be made
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
        sys.exit(f"unshare(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}")
    os.write(w2, b"x")
    os.read(r, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as fh:
        fh.write("0")
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
    os.execvp(cmd[0], cmd)
os.read(r2, 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as fh:
        fh.write("0 0 4294967295")
os.write(w, b"x")
_, status = os.waitpid(pid, 0)
print(f"exit status {os.waitstatus_to_exitcode(status)}")
EOF
