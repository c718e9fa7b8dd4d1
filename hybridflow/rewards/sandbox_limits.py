"""Per-sample bounds of the code sandbox that hold across forks without a cgroup.

A sample's program may fork, so per-process ``RLIMIT_AS`` alone lets N children hold N
times ``memory_mb`` (issue 38 measured 2.1 GB from four children against 1024 MiB). The
sandbox therefore bounds the sample as a whole:

- :func:`tree_rss_bytes`: the resident memory of the sandbox's whole process tree, which the
  supervisor reads every :data:`WATCH_INTERVAL_S` and kills the tree when it passes
  ``memory_mb`` -- a bound between polls too: ``RLIMIT_AS`` per process times
  ``RLIMIT_NPROC`` processes;
- :func:`seccomp_filter`: ``memfd_create``, SysV ``shmget``, ``semget``, ``msgget`` and POSIX
  ``mq_open`` refused (memory that no process's address space holds: 1.5 GB of semaphore sets and
  1.4 GB of message queues held before issue 61), and every syscall of a foreign ABI (i386, x32);
- the writable file systems are small tmpfs (see ``code_sandbox``): ``/dev`` is read-only,
  ``/dev/shm`` is :data:`SHM_BYTES`; :func:`tmpfs_mount_prefix` caps each one's inodes too
  (:data:`TMPFS_INODES`), because an empty file holds kernel memory (~1.2 KiB of inode and
  dentry) that neither ``size=`` nor any process's memory counts: 1.4 M empty files held
  1,747 MB of slab under ``memory_mb=1024`` before (issue 50).

Where a memory cgroup can be made (:mod:`sandbox_cgroup`), the kernel bounds the sample instead of
:func:`tree_rss_bytes`, which is then the fallback.
"""

from __future__ import annotations

import os
import platform
import shlex
import struct

WATCH_INTERVAL_S = 0.02
SHM_BYTES = 16 * 2**20
TMPFS_INODES = 4096
"""Inodes (files, folders, links) of each writable tmpfs: at most ~5 MiB of kernel memory each."""
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

# seccomp / classic BPF constants (linux/seccomp.h, linux/filter.h, linux/audit.h)
_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_REFUSE = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_X32_SYSCALL_BIT = 0x40000000
# machine -> (AUDIT_ARCH_*, {syscall: number}) of the syscalls that make memory no process holds:
# memfd_create, SysV shared memory, semaphore sets and message queues, POSIX message queues
_ARCHES = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180}),
}
_BLOCKED_NAMES = ("memfd_create", "shmget", "semget", "msgget", "mq_open")


def _statement(code: int, k: int, true_skip: int = 0, false_skip: int = 0) -> bytes:
    return struct.pack("=HBBI", code, true_skip, false_skip, k)


def seccomp_filter() -> bytes | None:
    """The compiled filter bwrap's ``--seccomp`` reads, or None on a machine not in the table."""
    if platform.machine() not in _ARCHES:
        return None
    arch, numbers = _ARCHES[platform.machine()]
    blocked = [numbers[name] for name in _BLOCKED_NAMES]
    program = [
        _statement(_LOAD_WORD, 4),  # seccomp_data.arch
        _statement(_JUMP_EQUAL, arch, true_skip=1),
        _statement(_RETURN, _REFUSE),
        _statement(_LOAD_WORD, 0),  # seccomp_data.nr
    ]
    if platform.machine() == "x86_64":
        program += [_statement(_JUMP_AT_LEAST, _X32_SYSCALL_BIT, false_skip=1), _statement(_RETURN, _REFUSE)]
    for number in blocked:
        program += [_statement(_JUMP_EQUAL, number, false_skip=1), _statement(_RETURN, _REFUSE)]
    return b"".join(program + [_statement(_RETURN, _ALLOW)])


def tree_rss_bytes(root_pid: int) -> int:
    """Resident bytes of ``root_pid`` and all its descendants (shared pages counted per process)."""
    total, stack, seen = 0, [root_pid], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * _PAGE_BYTES
            for thread in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{thread}/children") as handle:
                    stack += [int(child) for child in handle.read().split()]
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked
    return total


def tmpfs_fstab(mounts: list[tuple[str, int]]) -> str:
    """fstab lines for a tmpfs of ``size`` bytes and :data:`TMPFS_INODES` inodes on each ``(path, size)``."""
    lines = []
    for path, size in mounts:
        escaped = path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
        lines.append(f"tmpfs {escaped} tmpfs size={size},nr_inodes={TMPFS_INODES},mode=0755,nosuid,nodev 0 0\n")
    return "".join(lines)


def tmpfs_mount_prefix(fstab_path: str, join_cgroup: str | None = None, wait_stdin: str | None = None) -> list[str]:
    """The argv to put before bwrap's: a new user and mount namespace of its own (util-linux
    ``unshare``; the caller's uid is root in there, nobody else's) that mounts the tmpfs of
    ``fstab_path`` (:func:`tmpfs_fstab`, one ``mount`` for all), then execs bwrap, which binds them
    into the sandbox (bwrap's own ``--tmpfs`` has no inode cap). The mounts live only in that
    namespace: the host sees none, and they vanish with the sandbox. ~7 ms a sandbox.

    ``join_cgroup``: the ``cgroup.procs`` the shell writes its pid into first (the sample's memory cgroup).
    ``wait_stdin``: a sandbox prepared ahead (``sandbox_spare``): once mounted, the shell reads one line of
    words from its stdin and execs bwrap with them appended (the harness's arguments), its stdin this path.

    A separate program, not a ``preexec_fn``: forked from a process with OpenMP threads (torch),
    the child is no longer single-threaded and ``unshare(CLONE_NEWUSER)`` refuses it.
    """
    join = f"echo $$ > {shlex.quote(join_cgroup)} && " if join_cgroup else ""  # first, before anything forks
    script = f'{join}mount -n -a -T {shlex.quote(fstab_path)} && exec "$@"'
    if wait_stdin is not None:  # no globbing of the words; without a line (the pipe closed) it ends here
        script = script.replace('exec "$@"', f'set -f && read -r args && exec "$@" $args < {shlex.quote(wait_stdin)}')
    return ["unshare", "--user", "--map-root-user", "--mount", "--", "sh", "-c", script, "sh"]
