"""The gateway's user store: analyst names and slow salted password hashes (argon2id, from
argon2-cffi), in ``<data dir>/users.json``.

- The file holds ``{"version": 1, "users": {name: {"hash": "$argon2id$…", "created_at": t}}}`` and
  is written atomically (temporary file, fsync, ``os.replace``) with mode 0600. Passwords are
  never stored, printed or logged.
- ``verify(name, password)`` takes the same path for an unknown user as for a wrong password: it
  verifies against a dummy hash of the same parameters, so the two cannot be told apart by timing.
- Only the gateway process (and the administrator's CLI) reads the file; analysts never do. The
  gateway's engine worker cannot read it either (Landlock, dpch.engine_worker).
- A record may carry ``"limits"``: per-user engine limits (names of `dpch.engine_worker.EngineLimits`)
  that override the gateway's defaults for that analyst's statements.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
import time
from pathlib import Path

from .errors import InvalidParameter

USERS_FILE = "users.json"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.@-]{0,63}$")


def _hasher():
    from argon2 import PasswordHasher

    return PasswordHasher()  # argon2id, RFC 9106 low-memory profile (t=3, m=64 MiB, p=4)


def check_user_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidParameter("user name must be 1-64 characters: a letter or _, then letters, digits, _ . @ -")
    if name == "default":
        raise InvalidParameter("'default' is reserved (it is the name clients send without credentials)")
    return name


class UserStore:
    def __init__(self, data_dir: str | Path):
        self.path = Path(data_dir) / USERS_FILE
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._users: dict[str, dict] = {}
        self._ph = _hasher()
        self._dummy_hash = self._ph.hash(secrets.token_hex(16))
        # successful verifications, keyed by user, as a keyed digest of the password (never the
        # password itself); cleared whenever the file changes
        self._cache_key = secrets.token_bytes(32)
        self._verified: dict[str, tuple[str, bytes]] = {}

    # -- storage ---------------------------------------------------------------------------------
    def _file_stamp(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> dict[str, dict]:
        stamp = self._file_stamp()
        if stamp == self._stamp and (stamp is not None or not self._users):
            return self._users
        if stamp is None:
            users: dict[str, dict] = {}
        else:
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
            users = dict(doc.get("users", {}))
        self._users, self._stamp = users, stamp
        self._verified.clear()
        return users

    def _save(self, users: dict[str, dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".users.", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": 1, "users": users}, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- administration --------------------------------------------------------------------------
    def add(self, name: str, password: str, *, replace: bool = False) -> None:
        check_user_name(name)
        if not isinstance(password, str) or len(password) < 8:
            raise InvalidParameter("password must have at least 8 characters")
        with self._lock:
            users = dict(self._load())
            if name in users and not replace:
                raise InvalidParameter(f"user {name!r} exists already (use --replace to change the password)")
            rec = {"hash": self._ph.hash(password), "created_at": time.time()}
            if users.get(name, {}).get("limits"):  # a new password keeps the user's engine limits
                rec["limits"] = users[name]["limits"]
            users[name] = rec
            self._save(users)
            self._stamp = None

    def remove(self, name: str) -> None:
        with self._lock:
            users = dict(self._load())
            if name not in users:
                raise InvalidParameter(f"no user {name!r}")
            del users[name]
            self._save(users)
            self._stamp = None

    def set_limits(self, name: str, limits: dict | None) -> None:
        """Set (or, with None, remove) ``name``'s engine-limit overrides, validated against
        `dpch.engine_worker.EngineLimits`."""
        from .engine_worker import EngineLimits

        if limits:
            try:
                EngineLimits().with_overrides(limits)
            except (TypeError, ValueError) as exc:
                raise InvalidParameter(str(exc)) from None
        with self._lock:
            users = dict(self._load())
            if name not in users:
                raise InvalidParameter(f"no user {name!r}")
            rec = dict(users[name])
            if limits:
                rec["limits"] = dict(limits)
            else:
                rec.pop("limits", None)
            users[name] = rec
            self._save(users)
            self._stamp = None

    def limits(self, name: str) -> dict | None:
        """``name``'s engine-limit overrides (None: the gateway's defaults)."""
        with self._lock:
            rec = self._load().get(name)
        return dict(rec["limits"]) if rec and rec.get("limits") else None

    def list(self) -> list[str]:
        with self._lock:
            return sorted(self._load())

    # -- authentication --------------------------------------------------------------------------
    def _digest(self, password: str) -> bytes:
        return hmac.new(self._cache_key, password.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def _lookup(self, name: str | None, password: str) -> tuple[dict | None, str, bool]:
        """(record, stored hash, whether this exact password verified before for this hash)."""
        with self._lock:
            users = self._load()
            rec = users.get(name) if isinstance(name, str) else None
            stored = rec["hash"] if rec else self._dummy_hash
            cached = self._verified.get(name) if rec else None
        hit = cached is not None and cached[0] == stored and hmac.compare_digest(cached[1], self._digest(password))
        return rec, stored, hit

    def verified_before(self, name: str | None, password: str | None) -> bool:
        """True iff this exact (name, password) passed ``verify`` before and the user's hash has not
        changed since: a cheap check (an HMAC) that only a correct password can pass. False means
        "unknown": call ``verify``. Lets the gateway skip its argon2 thread for repeat clients; a
        wrong password or unknown user always takes the slow path, so they stay indistinguishable."""
        return self._lookup(name, password if isinstance(password, str) else "")[2]

    def verify(self, name: str | None, password: str | None) -> bool:
        """True iff ``name`` exists and ``password`` is its password. An unknown (or missing) user
        costs one argon2 verification against a dummy hash, exactly like a wrong password."""
        from argon2.exceptions import InvalidHashError, VerificationError

        password = password if isinstance(password, str) else ""
        rec, stored, hit = self._lookup(name, password)
        if hit:
            return True  # this exact password verified before (only a correct password gets here)
        try:
            ok = self._ph.verify(stored, password)
        except (VerificationError, InvalidHashError):
            ok = False
        ok = bool(ok and rec)
        if ok:
            with self._lock:
                self._verified[name] = (stored, self._digest(password))
        return ok
