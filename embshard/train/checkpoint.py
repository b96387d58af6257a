"""Sharded checkpoints with torch.distributed.checkpoint (DCP): every rank writes its own
shards, nothing is gathered, and a checkpoint loads into any plan and world size.

    save(root, step, parts, ctx, info, rank_info, keep_last)  -> root/step_000300/
    load(path, parts, ctx)                                    -> what the run needs to continue

Layout of ``step_NNNNNN/``: DCP's files (``.metadata``, ``__R_0.distcp``), ``train_state.json``
(step, samples consumed, tables, dense shapes, optimizer, every other file's SHA-256) and ``rank_R.json`` (RNG and data
position of rank R). Tensors are keyed ``tables.NAME.weight`` / ``tables.NAME.STATE`` (a
ShardedTensor of the full table's shape, or a plain tensor for data-parallel tables),
``dense.PARAM`` and ``dense_optim.PARAM.STATE``. Row-wise optimizer state (one value per
row and column block) is stored spread over the block's columns, [rows, dim], so it
reshards like the weights and a block reads back exactly.

Safety: a save goes to ``.tmp-step_NNNNNN`` and is renamed when complete, so a failed
write leaves the previous checkpoint as it was; each of its steps ends in a verdict shared by
all ranks, so a failure on one rank (disk full, permission) fails every rank at once. Every
file's SHA-256 is computed as it is written (embshard.train.checksums) and recorded in
``train_state.json``; a load verifies the files it reads (split over the ranks), checks the
tables, shapes and optimizers against the run, and refuses a damaged file or a mismatch by
name before touching anything. Checkpoints written before checksums load unverified, with a
CheckpointWarning. DCP's metadata is unpickled with an allow-list of its own classes, and
tensors are read with ``torch.load(weights_only=True)`` (DCP's default reader) -- no
arbitrary pickles.
"""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, init_from_local_shards
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.optim import ZeroRedundancyOptimizer

from embshard.fsutil import swap_in
from embshard.runtime.lookup import TORCH_DTYPE
from embshard.runtime.optim import state_shapes
from embshard.runtime.state import TableShard
from embshard.specs import TableSpec
from embshard.train.checksums import HashingFileSystem, verify, write_json
from embshard.launch.distributed import RankContext, SharedError, agree, all_gather

FORMAT, VERSION = "embshard-train-checkpoint", 1
STATE_FILE = "train_state.json"
STEP_PREFIX, TMP_PREFIX = "step_", ".tmp-"
# DCP deprecates ShardedTensor for DTensor, which cannot express uneven or irregular blocks;
# and it warns on every single-process load, which is what no_dist asks for.
warnings.filterwarnings("ignore", message=".*deprecating ShardedTensor.*")
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized.*")


class CheckpointError(RuntimeError):
    """Writing a checkpoint failed; the previous ones are intact."""


class CheckpointWarning(UserWarning):
    """A checkpoint loads, but not as safely as a current one (no checksums to verify)."""


@dataclass(frozen=True)
class Parts:
    """What a checkpoint holds of a run, and how to put it back."""

    specs: tuple[TableSpec, ...]
    table_shards: Callable[[], dict[str, TableShard]]  # this rank's blocks, with optimizer state
    load_tables: Callable[[dict[str, TableShard]], None]
    dense: tuple[tuple[str, nn.Parameter], ...]
    optimizer: torch.optim.Optimizer
    optimizer_name: str


@dataclass(frozen=True)
class Restored:
    path: Path
    step: int
    info: dict[str, Any]  # train_state.json
    rank_info: dict[str, Any]  # this rank's rank_R.json, or {} when the world size changed


# ---- save -------------------------------------------------------------------------------
def save(root: Path, step: int, parts: Parts, ctx: RankContext, info: dict[str, Any], rank_info: dict[str, Any],
         keep_last: int) -> Path:
    """Write this rank's part of ``root/step_NNNNNN`` (collective). A failure on any rank raises
    CheckpointError on every rank, and the previous checkpoints stay as they were."""
    name = f"{STEP_PREFIX}{step:06d}"
    final, tmp = root / name, root / f"{TMP_PREFIX}{name}"

    def on_every_rank(fn: Callable[[], Any]) -> Any:
        def describe(e: BaseException) -> str:
            return _describe(e) if isinstance(e, CheckpointException) or ctx.world_size == 1 \
                else f"rank {ctx.rank}: {_describe(e)}"

        try:
            return agree(ctx, fn, (OSError, CheckpointException), describe)
        except SharedError as e:
            raise CheckpointError(f"checkpoint: writing {tmp} failed ({e}); the previous checkpoints in {root} "
                                  "are intact") from None

    def prepare() -> None:
        if ctx.is_main:
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.glob(f"{TMP_PREFIX}*"):
                shutil.rmtree(stale)
            tmp.mkdir()

    def write_rank_files() -> dict[str, Any]:
        writer = FileSystemWriter(tmp)
        writer.fs = HashingFileSystem()  # every rank hashes its own files as it writes them
        dcp.save(_state_dict(parts, ctx), storage_writer=writer, process_group=ctx.pg, no_dist=ctx.pg is None)
        return {**writer.fs.files, f"rank_{ctx.rank}.json": write_json(tmp / f"rank_{ctx.rank}.json", rank_info)}

    def publish(files: dict[str, Any]) -> None:
        if ctx.is_main:
            write_json(tmp / STATE_FILE, {
                "format": FORMAT, "version": VERSION, "step": step, "world_size": ctx.world_size, **info,
                "tables": [{k: getattr(s, k) for k in ("name", "num_embeddings", "embedding_dim", "optimizer", "dtype")}
                           for s in parts.specs],
                "dense": {n: list(p.shape) for n, p in parts.dense}, "dense_optimizer": parts.optimizer_name,
                "files": dict(sorted(files.items()))})
            swap_in(tmp, final, root / f"{TMP_PREFIX}old-{name}")
            for stale in sorted(p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir())[:-keep_last]:
                shutil.rmtree(stale)

    on_every_rank(prepare)
    files = {k: v for rank_files in all_gather(ctx, on_every_rank(write_rank_files)) for k, v in rank_files.items()}
    on_every_rank(lambda: publish(files))
    return final


def _state_dict(parts: Parts, ctx: RankContext) -> dict[str, Any]:
    local = parts.table_shards()
    out: dict[str, Any] = {}
    for spec in parts.specs:
        shard = local.get(spec.name)
        tensors = {"weight": shard.weight} if shard is not None else {}
        if shard is not None:
            for key, value in shard.optimizer_state.items():
                tensors[key] = value if value.dim() != 1 else value[:, None].expand(shard.weight.shape).contiguous()
        for key in _table_keys(spec):
            full = f"tables.{spec.name}.{key}"
            if key == "step":
                if shard is not None:
                    out[full] = tensors[key]
            elif shard is not None and shard.replicated:
                out[full] = tensors[key]
            else:
                out[full] = _sharded(tensors.get(key), shard, spec, ctx)
    for name, param in parts.dense:
        out[f"dense.{name}"] = param.detach()
        for key, value in local_optimizer(parts.optimizer).state.get(param, {}).items():  # sharded: its owner saves it
            if isinstance(value, Tensor):
                out[f"dense_optim.{name}.{key}"] = value
    return out


def _table_keys(spec: TableSpec) -> list[str]:
    return ["weight", *state_shapes(spec.optimizer, 1, 1)] + (["step"] if spec.optimizer == "adam" else [])


def _sharded(block: Tensor | None, shard: TableShard | None, spec: TableSpec, ctx: RankContext) -> ShardedTensor:
    """A ShardedTensor of the full table's shape from this rank's block (collective: every rank calls it)."""
    local = []
    if shard is not None:
        meta = ShardMetadata([shard.row_offset, shard.col_offset], list(shard.weight.shape), f"rank:{ctx.rank}/{block.device}")
        local.append(Shard(block, meta))
    return init_from_local_shards(local, spec.num_embeddings, spec.embedding_dim, process_group=ctx.pg)


def _describe(e: BaseException) -> str:
    """One line about a failure; DCP's CheckpointException carries each rank's own exception."""
    if isinstance(e, CheckpointException) and e.failures:
        rank, (cause, _) = next(iter(sorted(e.failures.items(), key=lambda kv: kv[0])))
        e = cause
        prefix = f"rank {rank}: "
    else:
        prefix = ""
    text = str(e).strip().splitlines()
    return prefix + f"{type(e).__name__}: {text[0][:300] if text else ''}"


# ---- load -------------------------------------------------------------------------------
def resolve(path: str | Path, key: str) -> Path:
    """A step folder, or the latest complete step folder of a checkpoints folder (``key``: the setting that named it)."""
    path = Path(path)
    if (path / STATE_FILE).exists():
        return path
    steps = sorted(p for p in path.glob(f"{STEP_PREFIX}*") if (p / STATE_FILE).exists()) if path.is_dir() else []
    if not steps:
        raise ValueError(f"{key}={path}: no checkpoint there (no {STATE_FILE}); give a step_NNNNNN "
                         "folder written by embshard-train, or the checkpoints folder that holds them")
    return steps[-1]


def load(path: str | Path, parts: Parts, ctx: RankContext) -> Restored:
    """Verify the checkpoint and check it against the run, then load it into ``parts`` (any plan, any world size).

    Each step ends in a verdict shared by all ranks (SharedError on every rank): rank 0 checks the
    tables, every rank verifies its share of the files and reads its own rank file, DCP gathers
    read failures. Nothing is touched until all is read, and it returns only once every rank loaded.
    """
    def prepare() -> tuple[Path, dict[str, Any], Metadata, dict[str, Any]]:
        step_dir = resolve(path, "checkpoint.resume_from")
        info = read_info(step_dir)
        same_world = info["world_size"] == ctx.world_size
        verify_files(step_dir, info, same_world, ctx)
        if ctx.is_main:
            check(step_dir, parts)
        rank_info = read_rank_info(step_dir, ctx.rank) if same_world else {}
        return step_dir, info, read_metadata(step_dir), rank_info

    step_dir, info, metadata, rank_info = agree(ctx, prepare)
    dest = _destination(parts, ctx, metadata)
    try:
        dcp.load(dest, storage_reader=SafeReader(step_dir), process_group=ctx.pg, no_dist=ctx.pg is None)
    except (Exception, CheckpointException) as e:  # DCP wraps per-rank read failures (truncated or corrupt files)
        raise SharedError(f"checkpoint {step_dir}: cannot read its tensors, the files are corrupt or truncated "
                          f"({_describe(e)}); nothing was loaded") from None
    agree(ctx, lambda: _apply(dest, parts), (Exception,),
          lambda e: f"checkpoint {step_dir}: rank {ctx.rank} could not take its tensors ({_describe(e)})")
    return Restored(step_dir, int(info["step"]), info, rank_info)


def verify_files(path: Path, info: dict[str, Any], with_rank_files: bool, ctx: RankContext | None = None) -> None:
    """ValueError naming the first damaged file of the checkpoint that will be read (with ``ctx``: this rank's
    share of them); a checkpoint written before checksums is not verified, with a CheckpointWarning."""
    files = info.get("files")
    if files is None:
        if ctx is None or ctx.is_main:
            warnings.warn(f"checkpoint {path}: written without checksums (by an older embshard), so its files cannot be "
                          "verified; a damaged file would load unnoticed", CheckpointWarning, stacklevel=2)
        return
    if not isinstance(files, dict) or ".metadata" not in files:
        raise ValueError(f"checkpoint {path}: {STATE_FILE} lists no checksums for DCP's files; it is corrupt")
    names = sorted(n for n in files if with_rank_files or not n.startswith("rank_"))
    verify(path, files, names if ctx is None else names[ctx.rank::ctx.world_size])


def read_rank_info(path: Path, rank: int) -> dict[str, Any]:
    """rank_R.json (RNG and data position of rank R); ValueError naming the file if it is missing or not JSON."""
    rank_file = path / f"rank_{rank}.json"
    try:
        value = json.loads(rank_file.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"checkpoint {rank_file}: unreadable or not JSON ({e}); restore it, or resume on another "
                         "number of ranks (which does not read it)") from None
    if not isinstance(value, dict):
        raise ValueError(f"checkpoint {rank_file}: not a rank file of embshard-train (not a JSON object)")
    return value


def check(path: Path, parts: Parts) -> None:
    """ValueError unless the checkpoint at ``path`` holds every tensor this run needs, as it needs it."""
    info = read_info(path)
    check_compatible(info, parts, path)
    metadata = read_metadata(path)
    for spec in parts.specs:
        for key in _table_keys(spec):
            shape = [] if key == "step" else [spec.num_embeddings, spec.embedding_dim]
            dtype = torch.int64 if key == "step" else TORCH_DTYPE[spec.dtype] if key == "weight" else torch.float32
            _check_entry(metadata, f"tables.{spec.name}.{key}", shape, dtype, path)
    for name, param in parts.dense:
        _check_entry(metadata, f"dense.{name}", list(param.shape), param.dtype, path)
        prefix = f"dense_optim.{name}."
        for key, entry in metadata.state_dict_metadata.items():
            if key.startswith(prefix) and list(getattr(entry, "size", [None])) not in ([], list(param.shape)):
                raise ValueError(f"checkpoint {path}: {key} is not a tensor of shape [] or {list(param.shape)}")


def read_info(path: Path) -> dict[str, Any]:
    try:
        info = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"checkpoint {path}: {STATE_FILE} is unreadable or corrupt ({e})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or info.get("version") != VERSION:
        raise ValueError(f"checkpoint {path}: not an embshard-train checkpoint of version {VERSION}")
    missing = [k for k in ("step", "world_size", "tables", "dense", "dense_optimizer") if k not in info]
    if missing:
        raise ValueError(f"checkpoint {path}: {STATE_FILE} lacks {missing}; it is corrupt")
    return info


def check_compatible(info: dict[str, Any], parts: Parts, path: Path) -> None:
    saved = {t["name"]: t for t in info["tables"]}
    run = {s.name: s for s in parts.specs}
    problems = []
    if set(saved) != set(run):
        problems.append(f"tables only in the checkpoint {sorted(set(saved) - set(run))[:5]}, only in this run "
                        f"{sorted(set(run) - set(saved))[:5]}")
    for name in sorted(set(saved) & set(run)):
        s, r = saved[name], run[name]
        if (s["num_embeddings"], s["embedding_dim"]) != (r.num_embeddings, r.embedding_dim):
            problems.append(f"table {name!r} is {s['num_embeddings']}x{s['embedding_dim']} in the checkpoint but "
                            f"{r.num_embeddings}x{r.embedding_dim} here")
        elif (s["optimizer"], s["dtype"]) != (r.optimizer, r.dtype):
            problems.append(f"table {name!r} has optimizer {s['optimizer']}, {s['dtype']} in the checkpoint but "
                            f"{r.optimizer}, {r.dtype} here")
    dense, saved_dense = {n: list(p.shape) for n, p in parts.dense}, info["dense"]
    if set(dense) != set(saved_dense):
        problems.append(f"dense parameters only in the checkpoint {sorted(set(saved_dense) - set(dense))[:3]}, only in "
                        f"this run {sorted(set(dense) - set(saved_dense))[:3]}")
    for name in sorted(set(dense) & set(saved_dense)):
        if dense[name] != saved_dense[name]:
            problems.append(f"dense parameter {name!r} has shape {saved_dense[name]} in the checkpoint but {dense[name]} here")
    if info["dense_optimizer"] != parts.optimizer_name:
        problems.append(f"dense optimizer {info['dense_optimizer']} in the checkpoint, {parts.optimizer_name} here")
    if problems:
        raise ValueError(f"checkpoint {path} does not match this run: {'; '.join(problems[:4])}"
                         f"{' ...' if len(problems) > 4 else ''}; resume with the tables, model and optimizers it was "
                         "trained with")


def _destination(parts: Parts, ctx: RankContext, metadata: Metadata) -> dict[str, Any]:
    """Empty tensors in this run's layout to load into (collective: the ShardedTensors)."""
    local = parts.table_shards()
    dest: dict[str, Any] = {}
    for spec in parts.specs:
        shard = local.get(spec.name)
        for key in _table_keys(spec):
            full = f"tables.{spec.name}.{key}"
            if key == "step":
                if shard is not None:
                    dest[full] = torch.zeros((), dtype=torch.int64)
                continue
            dtype = TORCH_DTYPE[spec.dtype] if key == "weight" else torch.float32
            block = torch.zeros(shard.weight.shape, dtype=dtype, device=shard.weight.device) if shard else None
            dest[full] = block if shard is not None and shard.replicated else _sharded(block, shard, spec, ctx)
    for name, param in parts.dense:
        dest[f"dense.{name}"] = torch.empty_like(param.detach())
        prefix = f"dense_optim.{name}."
        for key, entry in metadata.state_dict_metadata.items():
            if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata):
                dest[key] = torch.empty(tuple(entry.size), dtype=entry.properties.dtype, device=param.device)
    return dest


def _check_entry(metadata: Metadata, key: str, shape: list[int], dtype: torch.dtype, path: Path) -> None:
    entry = metadata.state_dict_metadata.get(key)
    if not isinstance(entry, TensorStorageMetadata):
        raise ValueError(f"checkpoint {path}: no tensor {key!r}; the checkpoint is incomplete or corrupt")
    if list(entry.size) != shape or entry.properties.dtype != dtype:
        raise ValueError(f"checkpoint {path}: {key} is {list(entry.size)} {entry.properties.dtype}, this run needs "
                         f"{shape} {dtype}")


def _apply(dest: dict[str, Any], parts: Parts) -> None:
    """Copy the loaded tensors into the tables, dense parameters and dense optimizer."""
    shards = {}
    for name, template in parts.table_shards().items():
        spec = next(s for s in parts.specs if s.name == name)

        def block(key: str) -> Tensor:
            value = dest[f"tables.{name}.{key}"]
            return value.local_shards()[0].tensor if isinstance(value, ShardedTensor) else value

        table_state = {key: _per_row(block(key)) if current.dim() == 1 else block(key)
                       for key, current in template.optimizer_state.items()}
        shards[name] = TableShard(name, block("weight"), template.row_offset, template.col_offset, template.table_shape,
                                  spec.optimizer, table_state, template.replicated)
    parts.load_tables(shards)
    with torch.no_grad():
        for name, param in parts.dense:
            param.copy_(dest[f"dense.{name}"])
    optimizer = local_optimizer(parts.optimizer)
    position = {id(p): i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
    index = {name: position[id(p)] for name, p in parts.dense if id(p) in position}  # sharded: this rank's share
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in dest.items():
        if key.startswith("dense_optim."):
            param_name, _, state_key = key[len("dense_optim."):].rpartition(".")
            if param_name in index:
                state.setdefault(index[param_name], {})[state_key] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's dense state: a sharded one's local share (``optim.sharded_update``)."""
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def _per_row(block: Tensor) -> Tensor:
    """A row-wise state back from its [rows, cols] spread: exact when the block matches the saved one,
    the column-weighted mean when it spans several saved blocks."""
    first = block[:, 0]
    return torch.where((block == first[:, None]).all(1), first, block.mean(1))


# ---- safe reading -----------------------------------------------------------------------
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
     ("torch", "Size"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata unpickled through an allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self.path))
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_metadata(path: Path) -> Metadata:
    try:
        with (path / ".metadata").open("rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
        raise ValueError(f"checkpoint {path}: DCP metadata (.metadata) is missing, corrupt or not DCP's ({e})") from None
    if not isinstance(metadata, Metadata):
        raise ValueError(f"checkpoint {path}: .metadata does not hold DCP metadata")
    return metadata


def read_tables(path: str | Path) -> dict[str, Tensor]:
    """Every table's full weights from a checkpoint, in one process (inspection, export)."""
    path = resolve(path, "checkpoint")
    info = read_info(path)
    verify_files(path, info, with_rank_files=False)
    metadata = read_metadata(path)
    dest = {}
    for t in info["tables"]:
        key = f"tables.{t['name']}.weight"
        dest[key] = torch.empty(t["num_embeddings"], t["embedding_dim"], dtype=TORCH_DTYPE[t["dtype"]])
        _check_entry(metadata, key, list(dest[key].shape), dest[key].dtype, path)
    dcp.load(dest, storage_reader=SafeReader(path), no_dist=True)
    return {t["name"]: dest[f"tables.{t['name']}.weight"] for t in info["tables"]}
