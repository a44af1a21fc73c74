"""Operating-system confinement of the calling process with Linux Landlock (through ctypes).

Why: chDB evaluates table functions such as ``file('/etc/passwd')`` with the full file access of its
process, and none of its own settings stops that (DESIGN.md, "Facts"). The gateway therefore runs
the engine in a worker process that calls `confine` before chDB starts, so that a function that slips
past DPCH's allow-list reads nothing outside the paths granted here (DESIGN.md invariant 10).

Landlock rules are allow-lists over path hierarchies. After `confine` returns, this thread and every
thread and child process created later (the engine's threads, the UDF programs) can

- read (and list) only beneath ``read_only`` paths,
- read and execute only beneath ``executable`` paths,
- read, write, create, rename and delete only beneath ``read_write`` paths,
- open no TCP connection and bind no TCP port (ABI >= 4), and signal no process or connect to no
  abstract unix socket outside the sandbox (ABI >= 6).

Files opened before the call stay usable (the pipe to the gateway). The restriction cannot be
lifted: ``PR_SET_NO_NEW_PRIVS`` is set first, as Landlock requires of unprivileged callers.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path

# syscall numbers (x86-64 and aarch64 share the generic table for these)
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# filesystem access rights (include/uapi/linux/landlock.h), with the ABI that introduced them
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13       # ABI 2
FS_TRUNCATE = 1 << 14    # ABI 3
FS_IOCTL_DEV = 1 << 15   # ABI 5
NET_BIND_TCP = 1 << 0    # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1                # ABI 6

_FS_V1 = (1 << 13) - 1
READ = FS_READ_FILE | FS_READ_DIR
EXEC = READ | FS_EXECUTE
WRITE = (READ | FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG | FS_MAKE_SYM
         | FS_MAKE_FIFO | FS_MAKE_SOCK | FS_REFER | FS_TRUNCATE)


class ConfinementError(RuntimeError):
    """Landlock is unavailable or a rule could not be installed: the process is NOT confined."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class ConfinementReport:
    """What `confine` installed: the Landlock ABI, the rights it handles, and the granted paths
    (those that did not exist are listed in ``skipped``)."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    read_only: tuple[str, ...]
    read_write: tuple[str, ...]
    executable: tuple[str, ...]
    list_only: tuple[str, ...] = field(default=())
    skipped: tuple[str, ...] = field(default=())


def _libc():
    lib = ctypes.CDLL(None, use_errno=True)  # the process's own libc (find_library would run ldconfig)
    lib.syscall.restype = ctypes.c_long
    return lib


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    libc = _libc()
    v = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(v) if v > 0 else 0


def _rights(abi: int) -> tuple[int, int, int]:
    fs = _FS_V1
    if abi >= 2:
        fs |= FS_REFER
    if abi >= 3:
        fs |= FS_TRUNCATE
    if abi >= 5:
        fs |= FS_IOCTL_DEV
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    return fs, net, scoped


def confine(read_only: list[Path], read_write: list[Path], executable: list[Path],
            list_only: list[Path] = ()) -> ConfinementReport:
    """Restrict the calling thread and everything it starts afterwards to the given paths (see the
    module docstring). Paths that do not exist are skipped. A regular file as a path grants that file
    only. Raises ConfinementError if Landlock is unavailable or any step fails: the caller decides
    whether to go on unconfined (the gateway does not, unless told explicitly)."""
    abi = landlock_abi()
    if abi < 1:
        raise ConfinementError("Landlock is not available in this kernel (or is disabled)")
    fs, net, scoped = _rights(abi)
    libc = _libc()
    attr = _RulesetAttr(fs, net, scoped)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    rfd = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                       ctypes.c_uint32(0))
    if rfd < 0:
        raise ConfinementError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    skipped: list[str] = []
    # a file rule may carry file rights only (the kernel refuses directory rights on a file)
    file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
    try:
        for paths, rights in ((list_only, FS_READ_DIR), (read_only, READ), (executable, EXEC), (read_write, WRITE)):
            for p in paths:
                try:
                    pfd = os.open(str(p), os.O_PATH | os.O_CLOEXEC)
                except FileNotFoundError:
                    skipped.append(str(p))
                    continue
                try:
                    allowed = rights & fs
                    if not Path(p).is_dir():
                        allowed &= file_rights
                    if Path(p).is_char_device():
                        allowed |= FS_IOCTL_DEV & fs
                    rule = _PathBeneathAttr(allowed, pfd)
                    if libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(rfd), ctypes.c_int(_RULE_PATH_BENEATH),
                                    ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                        raise ConfinementError(f"landlock_add_rule({p}) failed: {os.strerror(ctypes.get_errno())}")
                finally:
                    os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfinementError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(rfd), ctypes.c_uint32(0)) != 0:
            raise ConfinementError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(rfd)
    return ConfinementReport(abi=abi, handled_fs=fs, handled_net=net, scoped=scoped,
                             read_only=tuple(map(str, read_only)), read_write=tuple(map(str, read_write)),
                             executable=tuple(map(str, executable)), list_only=tuple(map(str, list_only)),
                             skipped=tuple(skipped))
