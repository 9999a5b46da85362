"""The reference's facts of a ``tokenizer.json`` kept on disk, by the file's digest.

Computing them (``tokens.reference``) takes ``tokenizers``' own load of the
vocabulary in a child process: for Gemma 3's 262,144 pieces ~1.5-2 s of CPU and a
~370 MB peak, at every start. They depend only on the file's bytes, on what the child
computes (``PROBE``, ``FORMAT``, kvgate's version) and on ``tokenizers``' version, so
a restart reads them from ``<dir>/<key>.json`` instead, where ``key`` digests all of
these: an edited file, a new probe or a new ``tokenizers`` misses.

The file is untrusted input: read without following links, at most ``MAX_BYTES``,
parsed and checked field by field (``Reference.parse``) and against the key it says it
is for; anything else is a miss, and the child runs as without a cache. A file is
written whole or not at all (a temporary file renamed over it), in a folder only its
user may enter. The facts are then checked as the child's are (``tokens.encoders``: the
library's ids of the probe; kept facts it disagrees with are replaced). What that does
not catch is a well-formed file forged to name wrong added tokens: whoever can write
the user's cache folder can as well edit the ``tokenizer.json`` itself.

Example::

    tokenizers:
      gemma-3-270m: {kind: hf, path: /models/gemma, reference_cache: auto}  # the default
      llama-3-8b: {kind: hf, path: /models/llama, reference_cache: "off"}
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import kvgate
from kvgate.tokens.reference import PROBE, Reference

logger = logging.getLogger(__name__)

FORMAT = 1
"""What the child computes and how it is stored: raise it when either changes."""

MAX_BYTES = 64 << 20
"""The largest cache file read (Gemma's facts: ~230 kB)."""


def cache_folder(setting: str) -> Path | None:
    """The folder ``reference_cache`` names: ``auto``, ``$XDG_CACHE_HOME/kvgate/tokenizers``
    (``~/.cache`` without it); ``off``, none; else that folder.

    A relative ``XDG_CACHE_HOME`` is ignored, as the XDG spec requires (it would be
    taken from whatever folder the gateway started in), and a relative home (``HOME=``)
    keeps nothing."""
    if setting == "off":
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    if base and os.path.isabs(base):
        return Path(base) / "kvgate" / "tokenizers"
    try:
        home = Path.home()
    except RuntimeError:  # no HOME and a user without a passwd entry (a container)
        home = None
    if home is None or not home.is_absolute():
        logger.warning("no home folder to keep the reference's facts in: not kept")
        return None
    return home / ".cache" / "kvgate" / "tokenizers"


def _tokenizers_version() -> str:
    try:
        return metadata.version("tokenizers")
    except metadata.PackageNotFoundError:
        return "none"


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else (a file another user can write
    into could name any added tokens: the gateway's ids and prefix hashes)."""
    euid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    return st.st_uid == euid and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


class FactCache:
    """``tokens.reference`` facts by ``tokenizer.json`` digest in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def key(self, file: Path) -> str:
        """The digest of ``file``'s bytes and of what computes its facts."""
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        made_by = json.dumps([FORMAT, kvgate.__version__, _tokenizers_version(), PROBE])
        return hashlib.sha256(f"{digest.hexdigest()}\n{made_by}".encode()).hexdigest()

    def get(self, key: str) -> Reference | None:
        """The facts kept for ``key``, or None (none kept, or a file that is not them)."""
        path = self.folder / f"{key}.json"
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise ValueError("not a regular file")
                if not (_private(os.stat(self.folder)) and _private(os.fstat(f.fileno()))):
                    raise ValueError("its folder or itself not this user's alone")
                raw = f.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("key") != key:
                raise ValueError("kept for another key")
            return Reference.parse(data.get("facts"))
        except (OSError, ValueError, RecursionError) as exc:
            logger.warning("ignoring the reference cache file %s: %s", path, exc)
            return None

    def put(self, key: str, facts: Reference) -> None:
        """Keep ``facts`` for ``key``: written whole or not at all (failures logged)."""
        text = json.dumps({"key": key, "facts": asdict(facts)})
        tmp = None
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _private(os.stat(self.folder)):  # mkdir leaves an existing folder as is
                raise PermissionError("the folder is not this user's alone")
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".facts-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, self.folder / f"{key}.json")
            tmp = None
        except OSError as exc:
            logger.warning("cannot keep the reference's facts in %s: %s", self.folder, exc)
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
