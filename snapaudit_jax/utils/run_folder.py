"""Run folders owned by one run: a configuration stamp and an exclusive lock.

A config-file command (``snapaudit audit``, ``cpa``, ``pii``) writes its results and its resume files (answer
caches, snapshots, checkpoints) into one folder, ``--out``. A :class:`RunFolder` makes that folder belong to
one configuration and, while a run writes it, to one process:

* **The stamp** ``run.json``: ``{"format", "command", "version", "fingerprint", "config"}`` -- the stamp's own
  format (:data:`STAMP_FORMAT`), the command, the version of its resume files, the SHA-256 fingerprint of the
  three, and the configuration itself in the shape of its TOML file (``config["audit"]["trials"]`` is the key
  ``audit.trials``), defaults filled in. A rerun of the same configuration resumes from the folder; another
  configuration is refused, naming the first key that differs and both values.
* **The lock** ``run.lock``: an exclusive :func:`fcntl.flock` held by the run's process for the whole run. The
  kernel releases it when the process ends, however it ends, so a lock is stale exactly when its holder is dead,
  never after a timer. The holder writes who it is (pid, host, command, start time) into the file, so that a
  second run is refused naming it; a finished run removes the file.

Every refusal comes before any work and changes no byte of the folder: :meth:`RunFolder.check` reads the stamp
and tests the lock without taking it. :meth:`RunFolder.claim` then creates the folder, takes the lock, checks
again under it (another run may have stamped the folder in between), writes the stamp and removes the temporary
files an interrupted run left (:func:`remove_leftovers`: they may hold private weights).

A folder without a stamp: a missing or empty one is new; one that holds only the command's resume files (an
interrupted run of an earlier version: its answer caches are keyed by model and prompt, its snapshots by their
own fingerprint) is adopted; one that holds a finished run (results files) or anything else is refused -- it
cannot be told whether it is a run of this configuration, and overwriting it could destroy another run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from snapaudit_jax.utils.errors import ConfigFileError, InputError
from snapaudit_jax.utils.io import dumps, to_json, write_json

__all__ = ["LOCK_FILE", "STAMP_FILE", "STAMP_FORMAT", "RunFolder", "first_difference", "remove_leftovers"]

STAMP_FILE = "run.json"
LOCK_FILE = "run.lock"
STAMP_FORMAT = 1  # of run.json's own layout; a command's resume files have their own ``version``
_STAMP_KEYS = ("format", "command", "version", "fingerprint", "config")
_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "not set"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


_LEFTOVER = re.compile(r"^\.(tmp-|probe-|.+\.tmp-|.+\.old-)")


def remove_leftovers(folder: str) -> list[str]:
    """Removes the temporary files and folders an interrupted run left anywhere under ``folder``.

    Every write of a run goes into a temporary sibling named ``.tmp-*`` (files, checkpoints, the run key),
    ``.<name>.tmp-*`` or ``.<name>.old-*`` (exported folders) or ``.probe-*`` (a write test), renamed into place
    when complete; a ``kill -9`` or a power cut leaves such a sibling behind, and it may hold private weights or
    optimizer state. Called with the run's lock held (:meth:`RunFolder.claim`), so no live writer owns one.
    Symbolic links are removed, never followed.

    Args:
      folder: the run folder.

    Returns:
      The removed paths.
    """
    removed = []
    for parent, dirs, files in os.walk(folder):
        for name in [d for d in dirs if _LEFTOVER.match(d)] + [f for f in files if _LEFTOVER.match(f)]:
            path = os.path.join(parent, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
        dirs[:] = [d for d in dirs if not _LEFTOVER.match(d)]
    return removed


def first_difference(there: Any, here: Any, prefix: str = "") -> tuple[str, Any, Any] | None:
    """The first key at which two TOML-shaped configurations differ.

    Tables (dicts) are compared key by key, those of ``here`` first in their order, then those only ``there``;
    any other value (numbers, strings, lists) is compared whole.

    Args:
      there: the configuration a folder's stamp records.
      here: this run's configuration.
      prefix: the dotted key of ``there`` and ``here`` (``""`` at the top).

    Returns:
      ``(dotted key, value there, value here)`` (a side that lacks the key has the value ``"not set"``), or
      ``None`` if they are equal.
    """
    if isinstance(there, dict) and isinstance(here, dict):
        for key in [*here, *(k for k in there if k not in here)]:
            found = first_difference(there.get(key, _MISSING), here.get(key, _MISSING),
                                     f"{prefix}.{key}" if prefix else str(key))
            if found is not None:
                return found
        return None
    if there is not _MISSING and here is not _MISSING and _canonical(there) == _canonical(here):
        return None
    return prefix, _show(there), _show(here)


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """A run folder as one run of one configuration owns it (see the module docstring).

    Attributes:
      path: the folder (it may not exist yet).
      command: the command whose run it is (``"audit"``).
      config: the configuration in the shape of its TOML file (``{section: {key: value}}``), every key that can
        change results, defaults filled in; stored as its :func:`~snapaudit_jax.utils.io.to_json` form.
      version: the version of the command's resume files; a stamp of another version is refused.
      results: names of the files of a finished run (``"results.json"``): a folder that holds one of them but
        no stamp is refused.
      resume: names of the resume files and folders an unstamped folder may hold and still be adopted (an
        interrupted run of an earlier version): ``("llm_cache.jsonl", "snapshots")``.
      legacy: the stamp an earlier version wrote for this configuration (``pii``'s ``{"version", "config"}``),
        or ``None``: a folder stamped so is this run's (its stamp is rewritten when claimed); any other stamp
        of that earlier shape is refused.
      name: what errors call the folder (the flag, ``"--out"``).
    """

    path: str
    command: str
    config: Mapping[str, Any]
    version: int = 1
    results: tuple[str, ...] = ()
    resume: tuple[str, ...] = ()
    legacy: Mapping[str, Any] | None = None
    name: str = "--out"

    def __post_init__(self):
        object.__setattr__(self, "path", os.fspath(self.path))
        object.__setattr__(self, "config", to_json(dict(self.config)))
        if self.legacy is not None:
            object.__setattr__(self, "legacy", to_json(dict(self.legacy)))

    # --- the stamp -------------------------------------------------------------------------------------------
    @property
    def stamp_path(self) -> str:
        """The stamp file, ``<path>/run.json``."""
        return os.path.join(self.path, STAMP_FILE)

    @property
    def lock_path(self) -> str:
        """The lock file, ``<path>/run.lock``."""
        return os.path.join(self.path, LOCK_FILE)

    @property
    def fingerprint(self) -> str:
        """SHA-256 (64 hex digits) of the command, the resume files' version and the configuration."""
        return _fingerprint(self.command, self.version, self.config)

    def stamp(self) -> dict:
        """The stamp this run writes: ``{"format", "command", "version", "fingerprint", "config"}``.

        Returns:
          The stamp as a JSON object.
        """
        return {"format": STAMP_FORMAT, "command": self.command, "version": self.version,
                "fingerprint": self.fingerprint, "config": self.config}

    # --- checking and claiming -------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuses, before any work and writing nothing, a folder this run may not write.

        Raises:
          InputError: a folder another live run holds (naming its holder); a stamp that cannot be read, of
            another command, of another version of the command's resume files, or whose fingerprint does not
            match its configuration; an unstamped folder that holds a finished run or files that are not the
            command's resume files; a path that is not a folder.
          ConfigFileError: a folder stamped with another configuration (naming the first differing key and
            both values).
        """
        self._inspect(probe=True)

    @contextlib.contextmanager
    def claim(self) -> Iterator[RunFolder]:
        """Owns the folder for the ``with`` block: creates it, takes the lock, checks again, writes the stamp.

        Call it once the run is about to write (after every refusal that needs no folder). The lock is held
        until the block ends, and released by the kernel if the process dies first; the lock file is removed
        when the block ends.

        Yields:
          This :class:`RunFolder`.

        Raises:
          InputError: as :meth:`check` (another run took the lock or stamped the folder since).
          ConfigFileError: as :meth:`check`.
        """
        os.makedirs(self.path, exist_ok=True)
        fd = self._lock()
        try:
            if self._inspect(probe=False) != "stamped":
                write_json(self.stamp_path, self.stamp())
            remove_leftovers(self.path)
            yield self
        finally:
            self._unlock(fd)

    # --- internals ---------------------------------------------------------------------------------------------
    def _where(self) -> str:
        return f"{self.name} {self.path}"

    def _inspect(self, probe: bool) -> str:
        """``"new"``, ``"adopted"`` (resume files only), ``"legacy"`` or ``"stamped"``; raises the refusals."""
        if not os.path.exists(self.path):
            return "new"
        if not os.path.isdir(self.path):
            raise InputError(f"{self.name}: must be a folder, but {self.path!r} is a file")
        if probe:
            self._probe()
        if not os.path.lexists(self.stamp_path):
            return self._unstamped()
        return self._stamped(self._read_stamp())

    def _read_stamp(self) -> Any:
        try:
            with open(self.stamp_path, "rb") as fh:
                return json.loads(fh.read().decode())
        except (OSError, ValueError) as err:
            raise InputError(f"{self._where()}: {self.stamp_path} is not a readable run stamp ({err}); choose "
                             "another --out folder") from None

    def _stamped(self, old: Any) -> str:
        where, stamp_path = self._where(), self.stamp_path
        if isinstance(old, dict) and "format" not in old and set(old) == {"version", "config"}:
            if self.legacy is not None and old == self.legacy:
                return "legacy"  # this configuration's stamp of an earlier version: rewritten when claimed
            mine = self.legacy["config"] if self.legacy is not None else self.fingerprint[:16]
            raise ConfigFileError(f"{where} holds a run of another configuration (its run stamp {stamp_path}, "
                                  f"written by an earlier version, records only the fingerprint {old['config']}; "
                                  f"this configuration's is {mine}); choose another --out folder")
        if not isinstance(old, dict) or set(old) != set(_STAMP_KEYS):
            raise InputError(f"{where}: {stamp_path} is not a run stamp (a JSON object with the keys "
                             f"{', '.join(_STAMP_KEYS)}), got {str(old)[:80]!r}; choose another --out folder")
        if old["format"] != STAMP_FORMAT:
            raise InputError(f"{where}: its run stamp {stamp_path} has format {old['format']!r}, this version "
                             f"reads format {STAMP_FORMAT}; choose another --out folder")
        try:
            recorded = _fingerprint(old["command"], old["version"], old["config"])
        except (TypeError, ValueError):
            recorded = None
        if recorded != old["fingerprint"] or not isinstance(old["config"], dict):
            raise InputError(f"{where}: its run stamp {stamp_path} is corrupted or was edited: its fingerprint "
                             f"{str(old['fingerprint'])[:64]!r} does not match the configuration it records; "
                             "choose another --out folder")
        if old["command"] != self.command:
            raise InputError(f"{where} holds a run of snapaudit {old['command']}, not of snapaudit "
                             f"{self.command}; choose another --out folder")
        if old["version"] != self.version:
            raise InputError(f"{where} holds a run whose resume files are of version {old['version']!r}, this "
                             f"snapaudit {self.command} reads version {self.version}; choose another --out folder")
        if old["fingerprint"] == self.fingerprint:
            return "stamped"
        key, there, here = first_difference(old["config"], self.config) or ("config", "?", "?")
        raise ConfigFileError(f"{where} holds a run of another configuration: {key} is {there} there, {here} "
                              "here; choose another --out folder (or rerun it with its own configuration, "
                              f"recorded in {stamp_path}, to resume it)")

    def _unstamped(self) -> str:
        entries = sorted(e for e in os.listdir(self.path) if e != LOCK_FILE and not e.startswith(".tmp-"))
        if not entries:
            return "new"
        finished = [e for e in entries if e in self.results]
        keep = f"; its resume files ({', '.join(self.resume)}) can be moved into a new one" if self.resume else ""
        if finished:
            raise InputError(f"{self._where()} holds a finished run without a run stamp ({STAMP_FILE}), written by "
                             f"an earlier version or another program ({', '.join(finished)}): whether it is a run "
                             f"of this configuration cannot be told; choose another --out folder{keep}")
        foreign = [e for e in entries if e not in self.resume]
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            allowed = f"its resume files ({', '.join(self.resume)})" if self.resume else "no file"
            raise InputError(f"{self._where()} is not empty and holds no run stamp ({STAMP_FILE}): it holds "
                             f"{shown}, and snapaudit {self.command} adopts an unstamped folder only if it holds "
                             f"{allowed}; choose an empty or new --out folder{keep}")
        return "adopted"

    def _holder(self, fd: int) -> str:
        """Who holds the lock, from what the holder wrote into the lock file."""
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode())
            return (f"pid {int(info['pid'])} on {info['host']} ({info['command']}, started {info['started']})")
        except (OSError, ValueError, KeyError, TypeError):
            return "a process that has not written its name yet"

    def _held(self, fd: int) -> InputError:
        return InputError(f"{self._where()} is in use by another run: {self._holder(fd)}; its lock {self.lock_path} "
                          "is released when that process ends: wait for it, or choose another --out folder")

    def _probe(self) -> None:
        """Refuses a folder whose lock a live process holds, without taking the lock or writing anything."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as err:
            raise InputError(f"{self._where()}: its lock {self.lock_path} cannot be read ({err.strerror or err})"
                             ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: probes do not exclude each other
            except BlockingIOError:
                raise self._held(fd) from None
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _lock(self) -> int:
        """Takes the exclusive lock (refusing if a live run holds it), writes the holder; returns its descriptor."""
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                if not _exclusive(fd):
                    raise self._held(fd)
                try:
                    same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                break
            os.close(fd)  # its holder removed the file after we opened it: lock the file now at the path
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": f"snapaudit {self.command}",
                  "argv": list(sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = (dumps(holder) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return fd

    def _unlock(self, fd: int) -> None:
        try:
            if os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino:
                os.unlink(self.lock_path)  # while still held: a run that opened it retries on the new file
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)  # releases the lock


def _exclusive(fd: int) -> bool:
    """``flock(LOCK_EX)`` without waiting for a holder: ``False`` if another run holds it exclusively.

    A probe (:meth:`RunFolder.check`) holds a shared lock for an instant; a shared lock that can be taken
    shows that no exclusive holder exists, so the exclusive one is tried again (for at most about a second of
    shared holders: none holds one for longer).
    """
    for _ in range(1000):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # an exclusive holder
        fcntl.flock(fd, fcntl.LOCK_UN)
        time.sleep(0.001)
    return False


def _canonical(obj: Any) -> str:
    """The one JSON text of ``obj`` (sorted keys, no spaces): what fingerprints hash and values compare by."""
    return dumps(obj, sort_keys=True, separators=(",", ":"))


def _fingerprint(command: Any, version: Any, config: Any) -> str:
    return hashlib.sha256(_canonical({"command": command, "version": version, "config": config}).encode()).hexdigest()
