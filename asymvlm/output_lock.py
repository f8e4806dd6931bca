"""One writer per output folder (docs/data.md): :class:`OutputLock`, a ``flock`` on local disks,
a renewed lease file on object stores."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from asymvlm.errors import LockError
from asymvlm.storage import display, filesystem, is_remote, join, read_bytes

logger = logging.getLogger(__name__)

LOCK_NAME, LEASE_NAME = "_LOCK", "_LEASE.json"  # a flock locally, a lease on object stores


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _holder(info: dict[str, Any] | None) -> str:
    """``pid 123 on host-a, since ...`` from a lock's or lease's JSON."""
    if not info:
        return "holder unknown"
    since = info.get("since")
    when = f", since {_when(since)}" if isinstance(since, int | float) else ""
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}{when}"


class OutputLock:
    """Exclusive hold of ``ROOT/folder`` by one writer (docs/data.md): a ``flock`` on ``_LOCK``
    locally, a renewed ``_LEASE.json`` on object stores. Another holder is a :class:`LockError`
    naming it (after retrying ``wait`` s); :meth:`check` raises once the lease was lost."""

    def __init__(
        self,
        root: str,
        folder: str,
        *,
        name: str = "",
        wait: float = 0.0,
        ttl: float = 120.0,
        renew_every: float = 30.0,
        settle: float = 1.0,
        log=None,
    ) -> None:
        self.wait = wait
        self.ttl = ttl
        self.renew_every = renew_every
        self.settle = settle
        self.fs, base = filesystem(root)
        self.dir = join(base, folder) if folder else base
        self.local = not is_remote(root)
        suffix = f".{name}" if name else ""
        self.path = join(self.dir, f"{LOCK_NAME}{suffix}" if self.local else f"_LEASE{suffix}.json")
        self.shown = display(root, self.dir)  # the folder and the lock file, as messages name them
        self.uri = display(root, self.path)
        self.owner = uuid.uuid4().hex
        self._log = log or logger.warning
        self._fd: int | None = None  # the flock's descriptor (local)
        self._stop = threading.Event()  # the lease's renewal thread (object stores)
        self._thread: threading.Thread | None = None
        self._lost: str | None = None
        self._expires = 0.0
        self._since = 0.0

    def _busy(self, info: dict[str, Any] | None, detail: str = "; ") -> LockError:
        return LockError(
            f"{self.shown} is being written by another job ({_holder(info)}){detail}wait for "
            "it to finish or choose another --output"
        )

    def acquire(self) -> OutputLock:
        deadline = time.monotonic() + self.wait
        while True:
            try:
                self._acquire_local() if self.local else self._acquire_lease()
                return self
            except LockError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def check(self) -> None:
        """Raise :class:`LockError` if this writer no longer holds the output."""
        if self._lost is not None:
            raise LockError(
                f"{self.shown}: this job lost its write lease ({self._lost}); stopped before "
                "writing more -- re-run it once the other writer is done"
            )

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            if (self._read_lease() or {}).get("owner") == self.owner:
                self.fs.delete_file(self.path)
        except Exception as exc:  # the lease expires by itself
            self._log(f"could not remove {self.uri}: {exc}")

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _info(self) -> dict[str, Any]:
        return {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid()}

    def _acquire_local(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                info = json.loads(os.pread(fd, 4096, 0).decode() or "null")
            except (OSError, ValueError):
                info = None
            os.close(fd)
            raise self._busy(info) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**self._info(), "since": time.time()}).encode(), 0)
        self._fd = fd

    def _read_lease(self) -> dict[str, Any] | None:
        raw = read_bytes(self.uri)
        if raw is None:
            return None
        try:
            info = json.loads(raw.decode())
        except ValueError:
            return {}
        return info if isinstance(info, dict) else {}

    def _write_lease(self) -> None:
        self._expires = time.time() + self.ttl
        info = {**self._info(), "since": self._since, "expires": self._expires, "ttl": self.ttl}
        with self.fs.open_output_stream(self.path) as out:
            out.write(json.dumps({**info, "expires_utc": _when(self._expires)}).encode())

    def _acquire_lease(self) -> None:
        self.fs.create_dir(self.dir, recursive=True)
        current, now = self._read_lease(), time.time()
        if current is not None and current.get("owner") != self.owner:
            expires = current.get("expires")
            if isinstance(expires, int | float) and expires > now:
                left = f"; its lease expires at {_when(expires)} ({expires - now:.0f} s from now)"
                raise self._busy(current, left + " unless renewed -- ")
            self._log(f"taking over the expired lease on {self.shown} ({_holder(current)})")
        self._since = time.time()
        self._write_lease()
        time.sleep(self.settle)
        current = self._read_lease()
        if current is None or current.get("owner") != self.owner:
            raise self._busy(current, ", which took the lease at the same time; ")
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew, name="lease-renewal", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                current = self._read_lease()
                if current is None or current.get("owner") != self.owner:
                    self._lost = f"now held by {_holder(current)}"
                    return self._log(f"{self.shown}: lease lost ({self._lost})")
                self._write_lease()
            except Exception as exc:  # network trouble: retry until the lease would expire
                self._log(f"{self.shown}: could not renew the lease ({exc})")
                if time.time() >= self._expires:
                    self._lost = "it expired while it could not be renewed"
                    return None
