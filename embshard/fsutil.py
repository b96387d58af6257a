"""Filesystem steps shared by checkpoints, plans, serving artifacts and rank results."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def swap_in(tmp: Path, final: Path, old: Path) -> None:
    """Put the finished folder `tmp` at `final`, replacing what was there.

    The previous `final` is moved to `old` first and deleted only after `tmp` took its place, so a
    crash at any point leaves either the previous or the new folder complete.
    """
    if final.exists():
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, so a reader never sees it partial."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
