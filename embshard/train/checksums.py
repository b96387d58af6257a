"""SHA-256 checksums of a checkpoint's files: computed as the bytes are written, checked before they are read.

Each rank hashes what it writes while writing it: DCP's shard files (and rank 0's
``.metadata``) through `HashingFileSystem`, its ``rank_R.json`` from the encoded text
(`write_json`). Rank 0 records them all in ``train_state.json`` as ``files: {NAME: {sha256,
bytes}}``; `verify` refuses a file whose bytes are not those recorded, naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from torch.distributed.checkpoint.filesystem import FileSystem

from embshard.fsutil import sha256_file


def entry(sha256: str, num_bytes: int) -> dict[str, Any]:
    return {"sha256": sha256, "bytes": num_bytes}


class _HashingStream:
    """A binary file whose written bytes are hashed on the way out (DCP only writes forward)."""

    def __init__(self, file: Any) -> None:
        self.file, self.digest, self.num_bytes = file, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        self.digest.update(data)
        written = self.file.write(data)
        self.num_bytes += written
        return written

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close
        return getattr(self.file, name)


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording the checksum of every file written through it (by file name)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, dict[str, Any]] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = _HashingStream(stream)
            yield hashing
        self.files[Path(path).name] = entry(hashing.digest.hexdigest(), hashing.num_bytes)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)  # DCP writes .metadata.tmp, then renames it
        if Path(path).name in self.files:
            self.files[Path(new_path).name] = self.files.pop(Path(path).name)


def write_json(path: Path, value: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``value`` as JSON to ``path`` (synced to disk); its checksum entry."""
    data = json.dumps(value).encode()
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return entry(hashlib.sha256(data).hexdigest(), len(data))


def verify(folder: Path, files: Mapping[str, Any], names: list[str]) -> None:
    """ValueError naming the first of ``names`` in ``folder`` that is missing, unrecorded or changed."""
    for name in names:
        path = folder / name
        recorded = files.get(name)
        if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
            raise ValueError(f"checkpoint {path}: no checksum recorded for it in {folder / 'train_state.json'}; the "
                             "checkpoint is incomplete or was changed after it was written")
        try:
            size = path.stat().st_size
            damaged = size != recorded.get("bytes") or sha256_file(path) != recorded["sha256"]
        except OSError as e:
            raise ValueError(f"checkpoint {path}: cannot read it ({e.strerror}); the checkpoint is incomplete") from None
        if damaged:
            raise ValueError(f"checkpoint {path}: damaged (its SHA-256 or size differs from the one recorded when it was "
                             "written); nothing was loaded; restore the file, or resume from another step folder")
