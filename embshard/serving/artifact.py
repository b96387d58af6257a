"""The serving artifact: what `embshard-export` writes and `Predictor.load` reads, and its checks.

Layout of an artifact folder (no pickles anywhere):
    manifest.json        format, version, world size, SHA-256 and size of every other file
    model.json           DLRM settings, the tables as served (dtype per table), dense feature count, source checkpoint
    plan.json            the serving plan (planner inference mode) for ``world_size`` ranks
    dense.safetensors    the dense parameters (MLPs, interaction, attention), by parameter name
    rank_R.safetensors   rank R's blocks: ``TABLE.weight`` (float32 / float16 / uint8 int8 codes) and,
                         for int8, ``TABLE.scale_bias`` (float16 [rows, 2]); data-parallel tables on every rank,
                         and so are hot-row replicas ``TABLE@hot`` (the table's rows at its sorted hot ids)
    hot_ids.npz          only when the plan has hot rows (plan.json's hot_ids_file names it): each hot table's
                         hot ids, sorted (numpy .npz of int64 arrays, read without pickles)

Every file has a normal file's mode (0666 less the umask; safetensors alone would write 0600).
Every read goes through `verified_bytes`, which checks the file's SHA-256 against the manifest
first: a tampered, truncated or missing file is refused with its name (`ArtifactError`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file
from torch import Tensor

from embshard.fsutil import sha256_file
from embshard.models.config import DLRMConfig
from embshard.planner.plan import ShardingPlan
from embshard.serving.config import num_ranks
from embshard.serving.quantize import QuantizedBlock
from embshard.specs import TableSpec, tables_from_list
from embshard.schema import schema_of, value_of

FORMAT, VERSION = "embshard-serving-artifact", 1
MANIFEST, MODEL_FILE, PLAN_FILE, DENSE_FILE = "manifest.json", "model.json", "plan.json", "dense.safetensors"
HOT_IDS_FILE = "hot_ids.npz"
FIX = "export it again with embshard-export"


class ArtifactError(ValueError):
    """A bad or missing artifact file, a checksum mismatch or a wrong world size: names the file and the fix."""


def rank_file(rank: int) -> str:
    return f"rank_{rank}.safetensors"


@dataclass(frozen=True)
class ModelInfo:
    """model.json: how to rebuild the model around the served tables."""

    model: DLRMConfig
    specs: tuple[TableSpec, ...]  # the tables as served: pooled ones, then the sequence table
    num_dense: int
    source: Mapping[str, Any]  # the training checkpoint it came from, and its step

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "model": asdict(self.model), "num_dense": self.num_dense,
                           "tables": [s.to_dict() for s in self.specs], "source": dict(self.source)}, indent=1)


def model_config(raw: Any, where: str) -> DLRMConfig:
    """A DLRMConfig from its dict (as ``dataclasses.asdict`` wrote it), type-checked by the train app's schema."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema_of(DLRMConfig)), raw)
        return value_of(OmegaConf.to_object(merged))
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise ArtifactError(f"{where}: the model settings are invalid ({str(e).splitlines()[0]}); {FIX}") from None


def save_tensors(tensors: Mapping[str, Tensor], path: Path) -> None:
    """A safetensors file with the mode of the artifact's other files."""
    save_file(dict(tensors), path)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_manifest(folder: Path, world_size: int) -> None:
    """manifest.json over every file already in ``folder``."""
    files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in sorted(folder.iterdir()) if p.is_file()}
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "version": VERSION, "world_size": world_size,
                                               "files": files}, indent=1))


def read_manifest(folder: Path, world_size: int) -> dict[str, Any]:
    """The manifest, checked: this format and version, ``world_size`` ranks, every file listed."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing; {folder} is not a serving artifact ({FIX})") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: unreadable or not JSON ({e}); {FIX}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION \
            or not isinstance(manifest.get("files"), dict):
        raise ArtifactError(f"{path}: not an {FORMAT} manifest of version {VERSION}; {FIX}")
    if manifest.get("world_size") != world_size:
        planned = manifest.get("world_size")
        planned_ranks = num_ranks(planned) if isinstance(planned, int) else f"{planned!r} ranks"
        raise ArtifactError(f"{path}: the artifact was planned for {planned_ranks} but {world_size} loaded it; "
                            f"start {planned_ranks}, or export again with world_size={world_size}")
    needed = [MODEL_FILE, PLAN_FILE, DENSE_FILE, *(rank_file(r) for r in range(world_size))]
    missing = [n for n in needed if n not in manifest["files"]]
    if missing:
        raise ArtifactError(f"{path}: does not list {missing}; the artifact is incomplete ({FIX})")
    return manifest


def verified_bytes(folder: Path, manifest: Mapping[str, Any], name: str) -> bytes:
    """The bytes of ``name``, refused unless its SHA-256 matches the manifest."""
    path = folder / name
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read it ({e.strerror}); {FIX}") from None
    expected = manifest["files"][name]["sha256"]
    if hashlib.sha256(data).hexdigest() != expected:
        raise ArtifactError(f"{path}: checksum mismatch (SHA-256 differs from {MANIFEST}): the file was changed or "
                            f"corrupted after export; {FIX}")
    return data


def read_model(folder: Path, manifest: Mapping[str, Any]) -> ModelInfo:
    where = str(folder / MODEL_FILE)
    try:
        raw = json.loads(verified_bytes(folder, manifest, MODEL_FILE))
        specs = tables_from_list(raw["tables"], f"{where}: tables")
        num_dense = raw["num_dense"]
        source = raw["source"]
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ArtifactError):
            raise
        raise ArtifactError(f"{where}: malformed ({e}); {FIX}") from None
    if isinstance(num_dense, bool) or not isinstance(num_dense, int) or num_dense <= 0:
        raise ArtifactError(f"{where}: num_dense must be a positive integer, got {num_dense!r}; {FIX}")
    return ModelInfo(model_config(raw.get("model"), where), specs, num_dense, source)


def read_plan(folder: Path, manifest: Mapping[str, Any]) -> ShardingPlan:
    try:
        return ShardingPlan.from_json(verified_bytes(folder, manifest, PLAN_FILE).decode())
    except ArtifactError:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{folder / PLAN_FILE}: not a valid plan ({e}); {FIX}") from None


def read_hot_ids(folder: Path, manifest: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """hot_ids.npz: table -> its hot ids (verified; no pickles)."""
    if HOT_IDS_FILE not in manifest["files"]:
        raise ArtifactError(f"{folder / MANIFEST}: the plan has hot rows but the manifest does not list {HOT_IDS_FILE}; {FIX}")
    try:
        with np.load(io.BytesIO(verified_bytes(folder, manifest, HOT_IDS_FILE)), allow_pickle=False) as npz:
            return {name: np.asarray(npz[name], dtype=np.int64) for name in npz.files}
    except (OSError, ValueError) as e:
        if isinstance(e, ArtifactError):
            raise
        raise ArtifactError(f"{folder / HOT_IDS_FILE}: not a hot-ids file ({e}); {FIX}") from None


def read_tensors(folder: Path, manifest: Mapping[str, Any], name: str) -> dict[str, Tensor]:
    try:
        return load_safetensors(verified_bytes(folder, manifest, name))
    except SafetensorError as e:
        raise ArtifactError(f"{folder / name}: not a safetensors file ({e}); {FIX}") from None


def block_tensors(table: str, block: QuantizedBlock) -> dict[str, Tensor]:
    """The safetensors entries of one table block."""
    out = {f"{table}.weight": block.weight}
    if block.scale_bias is not None:
        out[f"{table}.scale_bias"] = block.scale_bias
    return out


def rank_blocks(tensors: Mapping[str, Tensor]) -> dict[str, tuple[Tensor, Tensor | None]]:
    """table -> (weight, scale_bias or None) from a rank file's entries."""
    tables = {key.rsplit(".", 1)[0] for key in tensors}
    return {t: (tensors[f"{t}.weight"], tensors.get(f"{t}.scale_bias")) for t in tables if f"{t}.weight" in tensors}

