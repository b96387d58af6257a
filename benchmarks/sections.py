"""Results files of marked sections (``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``): a benchmark mode rewrites
its own section and leaves the others' as they are."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent


def _marks(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def update_section(path: Path, name: str, text: str, title: str) -> None:
    """Put ``text`` in section ``name`` of ``path``: in place of the old one, else appended (a new file starts with ``title``)."""
    start, end = _marks(name)
    old = path.read_text() if path.exists() else f"{title}\n\n"
    block = f"{start}\n{text}\n{end}"
    if start in old and end in old:
        new = old[:old.index(start)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def write_keeping_section(path: Path, text: str, name: str) -> None:
    """Write ``text`` to ``path``, then section ``name`` as ``path`` had it (if it had it)."""
    start, end = _marks(name)
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(start):old.index(end) + len(end)] if start in old and end in old else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip() + "\n\n" + kept + "\n" if kept else text)


RESULTS = "benchmarks/results"  # what benchmarks write, not code: a results file changed by a run leaves the label clean


def commit_label(paths: Sequence[str] = (), root: Path = HERE) -> str:
    """The short commit of the checkout at ``root``, with "(uncommitted changes)" where tracked files (those under
    ``paths``, folders from the repository's root, if given; never those under RESULTS) differ from it: what a results
    file names as the code it measured."""
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                            *(f":(top){p}" for p in paths), f":(top,exclude){RESULTS}"],
                           capture_output=True, text=True)
    where = f" under {', '.join(paths)}" if paths else ""
    return (done.stdout.strip() or "unknown") + (f" (uncommitted changes{where})" if dirty.stdout.strip() else "")


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, for a results file's header."""
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


HOSTS_SECTION = "hosts"  # the multi-host run's section of a one-host benchmark's results file


def write_results(out: str | None, text: str, default: Path, hosts, quick: bool, title: str) -> Path | None:
    """Where a benchmark with a multi-host mode writes ``text`` (``hosts``: local_ranks.Hosts): --quick without --out
    nowhere; on emulated hosts the hosts section of ``out`` (default ``default``); on one host the whole file, its
    hosts section kept. The path written, or None."""
    if quick and out is None:
        return None
    path = Path(out) if out is not None else default
    if hosts.emulated:
        update_section(path, HOSTS_SECTION, text, title)
    else:
        write_keeping_section(path, text, HOSTS_SECTION)
    return path
