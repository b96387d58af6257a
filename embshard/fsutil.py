"""Filesystem steps shared by the checkpoint writer and the serving export."""

from __future__ import annotations

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
