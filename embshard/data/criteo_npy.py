"""Reader of Criteo preprocessed to numpy, as TorchRec's DLRM example uses it
(torchrec/datasets/scripts/npy_preproc_criteo.py): per day d in ``dir``,
``day_{d}_dense.npy`` float32 [N, 13] (already log-transformed), ``day_{d}_sparse.npy``
integer [N, 26] and ``day_{d}_labels.npy`` integer [N] or [N, 1].

    source = NpySource(CriteoNpyConfig(dir="criteo_npy", train_days=(0, 1)), layout, "train")

Files are memory-mapped (``allow_pickle=False``), so a rank touches only its own rows; the
days are one sequence of samples for `IndexedStream`. Categorical values become rows by
``value % num_embeddings`` of their table. Malformed rows (a label other than 0/1, a
negative categorical value, a non-finite dense value) are counted and skipped (the batch is
that much smaller), or stop the run with ``strict``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embshard.data.samples import NUM_DENSE, FeatureLayout, Samples
from embshard.data.config import CriteoNpyConfig
from embshard.data.criteo_tsv import NUM_CATEGORICAL, check_layout
from embshard.data.malformed import MalformedLog


class NpySource:
    def __init__(self, config: CriteoNpyConfig, layout: FeatureLayout, split: str) -> None:
        check_layout(layout, "data=criteo_npy")
        days = config.train_days if split == "train" else config.eval_days
        if not days:
            raise ValueError(f"data.{split}_days: empty; list the days of {config.dir!r} to read, e.g. [0]")
        self.rows = np.array([f.num_embeddings for f in layout.pooled], dtype=np.int64)
        self.malformed = MalformedLog(config.strict)
        self.days = [self._open(Path(config.dir), d) for d in days]
        self.starts = np.cumsum([0] + [len(d[2]) for d in self.days])
        self.num_samples = int(self.starts[-1])
        if self.num_samples == 0:
            raise ValueError(f"data: days {list(days)} of {config.dir!r} hold no samples")

    @staticmethod
    def _open(root: Path, day: int) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
        arrays = {}
        for part in ("dense", "sparse", "labels"):
            path = root / f"day_{day}_{part}.npy"
            try:
                arrays[part] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise ValueError(f"data: cannot read {path} ({e}); data.dir must hold day_{{d}}_dense/sparse/labels.npy") from None
        dense, sparse, labels = arrays["dense"], arrays["sparse"], arrays["labels"]
        labels = labels.reshape(-1) if labels.ndim == 2 and labels.shape[1] == 1 else labels
        problems = []
        if dense.ndim != 2 or dense.shape[1] != NUM_DENSE:
            problems.append(f"dense has shape {dense.shape}, expected [N, {NUM_DENSE}]")
        if sparse.ndim != 2 or sparse.shape[1] != NUM_CATEGORICAL or sparse.dtype.kind not in "iu":
            problems.append(f"sparse has shape {sparse.shape} ({sparse.dtype}), expected integers [N, {NUM_CATEGORICAL}]")
        if labels.ndim != 1:
            problems.append(f"labels have shape {arrays['labels'].shape}, expected [N] or [N, 1]")
        if not problems and not len(dense) == len(sparse) == len(labels):
            problems.append(f"row counts differ: dense {len(dense)}, sparse {len(sparse)}, labels {len(labels)}")
        if problems:
            raise ValueError(f"data: day {day} in {root}: {'; '.join(problems)}")
        return str(root / f"day_{day}"), dense, sparse, labels

    def read(self, start: int, count: int) -> Samples:
        parts = []
        day = int(np.searchsorted(self.starts, start, side="right")) - 1
        while count > 0:
            name, dense, sparse, labels = self.days[day]
            first = start - int(self.starts[day])
            n = min(count, len(labels) - first)
            # Copies of this rank's rows only (the memory maps are read-only).
            parts.append(self._rows(name, first, np.array(dense[first:first + n], np.float32),
                                    np.array(sparse[first:first + n], np.int64), np.array(labels[first:first + n])))
            start, count, day = start + n, count - n, day + 1
        return Samples.concat(parts)

    def _rows(self, name: str, first: int, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Samples:
        bad_label = (labels != 0) & (labels != 1)
        bad_dense = ~np.isfinite(dense).all(1)
        bad_sparse = (sparse < 0).any(1)
        bad = bad_label | bad_dense | bad_sparse
        for i in np.flatnonzero(bad):
            reason = ("label must be 0 or 1" if bad_label[i] else "a dense value is not finite" if bad_dense[i]
                      else "a categorical value is negative")
            self.malformed.record(f"{name} row {first + i}", reason)
        ids = (sparse % self.rows).T  # [26, n]
        samples = Samples(dense, labels.astype(np.float32), np.ones(ids.shape, np.int64), tuple(ids.copy()))
        return samples.select(~bad) if bad.any() else samples
