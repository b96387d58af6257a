"""Hot-id files: each table's ids hottest first, as embshard-stats measured them (``hot_ids=PATH``).

    write_hot_ids("hot_ids.npz", {"cat_0": ids_0, ...})    # numpy .npz, one int64 array per table
    rankings = read_hot_ids("hot_ids.npz", "hot_ids")

The planner may replicate a prefix of a ranking on every rank (plan.json's ``hot_rows`` and
``hot_ids_file``; embshard/planner/cost/hot_rows.py); the runtime reads the same file
(embshard/runtime/hot_rows.py). Read without pickles (``allow_pickle=False``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np


def write_hot_ids(path: str | Path, rankings: Mapping[str, np.ndarray]) -> None:
    """Write the rankings through a temporary file beside ``path`` (a reader never sees it partial)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **{name: np.asarray(ids, dtype=np.int64) for name, ids in rankings.items()})
    tmp.replace(path)


def read_hot_ids(path: str | Path, where: str) -> dict[str, np.ndarray]:
    """Every table's ranking in a hot-ids file; ValueError naming ``where`` if it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: np.asarray(npz[name], dtype=np.int64) for name in npz.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: cannot read the hot-ids file {str(path)!r} ({e}); write it with "
                         "embshard-stats hot_ids=PATH") from None
