"""Predictor: a serving artifact loaded on every rank of a process group, answering collectively.

    pg = dist.new_group(backend="gloo")                  # every serving rank
    predictor = Predictor.load(Path("artifact"), pg)     # checks checksums, reads only this rank's shards
    scores_B = predictor.predict(dense_BF, kjt)          # this rank's samples -> CTR scores
    rows_ND = predictor.lookup("t0", ids_N)              # dequantized embedding rows

The model is the training run's DLRM (embshard.models), rebuilt from the artifact's settings,
with forward-only sharded collections (embshard.runtime, ``optimizer=None``) in place of its
embedding modules: ids travel through the same all-to-all input and output dist as in
training, and each rank looks its blocks up with FBGEMM's inference kernel in the table's
dtype. Every call is collective: all ranks call it together, each with its own samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.models.config import TARGET_FEATURE
from embshard.models.dlrm import DLRM
from embshard.runtime.apply import apply_embedding_sharding
from embshard.runtime.collection import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.comm import start_header
from embshard.runtime.hot_rows import HOT
from embshard.serving.artifact import (DENSE_FILE, ArtifactError, ModelInfo, rank_blocks, rank_file, read_hot_ids,
                                       read_manifest, read_model, read_plan, read_tensors)
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.runtime.quantized import STORED_DTYPE

__all__ = ["ArtifactError", "Predictor", "ServingSchema", "merge_rank_errors"]


@dataclass(frozen=True)
class ServingSchema:
    num_dense: int  # dense features per sample
    sparse_features: Mapping[str, int]  # feature name -> num_embeddings (valid ids: [0, n))
    sequence_features: tuple[str, ...]  # subset of sparse_features looked up per id (others pooled)
    embedding_dims: Mapping[str, int]  # feature name -> embedding dim
    table_dtypes: Mapping[str, str]  # table name -> "fp32" | "fp16" | "int8"
    world_size: int  # ranks the artifact was planned for

    @classmethod
    def of(cls, info: ModelInfo, world_size: int) -> "ServingSchema":
        ordered = [s for s in info.specs if s.pooled] + [s for s in info.specs if not s.pooled]
        return cls(num_dense=info.num_dense,
                   sparse_features={f: s.num_embeddings for s in ordered for f in s.feature_names},
                   sequence_features=tuple(f for s in ordered if not s.pooled for f in s.feature_names),
                   embedding_dims={f: s.embedding_dim for s in ordered for f in s.feature_names},
                   table_dtypes={s.name: s.dtype for s in info.specs}, world_size=world_size)


class Predictor:
    def __init__(self, model: DLRM, schema: ServingSchema, pg: dist.ProcessGroup, device: torch.device) -> None:
        self.model, self.schema, self.pg, self.device = model.eval(), schema, pg, device
        self.pooled_features = [f for f in schema.sparse_features if f not in schema.sequence_features]

    @classmethod
    def load(cls, artifact_dir: Path, pg: dist.ProcessGroup) -> "Predictor":
        """Collective: every rank calls it; verifies checksums of what it reads (raises ArtifactError on every rank if any
        rank fails), each rank reads only its own shards + the dense weights. No pickle."""
        folder, rank, world_size = Path(artifact_dir), dist.get_rank(pg), dist.get_world_size(pg)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" else torch.device("cpu")
        error = None
        try:
            manifest = read_manifest(folder, world_size)
            info, plan = read_model(folder, manifest), read_plan(folder, manifest)
            hot_ids = read_hot_ids(folder, manifest) if any(t.hot_rows for t in plan.tables) else None
            dense = read_tensors(folder, manifest, DENSE_FILE)
            blocks = rank_blocks(read_tensors(folder, manifest, rank_file(rank)))
            _check_blocks(blocks, plan, info, rank, folder / rank_file(rank))
        except ArtifactError as e:
            error = str(e)
        errors: list[str | None] = [None] * world_size
        dist.all_gather_object(errors, error, group=pg)
        if any(errors):
            raise ArtifactError(merge_rank_errors(errors))
        # the unsharded tables are never allocated: sharded ones replace them
        model = DLRM(info.model, info.specs, info.num_dense, embedding_device="meta")
        model = apply_embedding_sharding(model, plan, pg, None, device, hot_ids)
        _load_dense(model, dense, folder / DENSE_FILE, device)
        for collection in _collections(model):
            collection.load_quantized({s.name: blocks[s.name] for s in collection.specs if s.name in blocks})
        return cls(model, ServingSchema.of(info, world_size), pg, device)

    @torch.inference_mode()
    def predict(self, dense_BF: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
        """Collective: every rank calls it with ITS OWN slice of samples (B_r may be 0; KJT keys = all schema sparse
        features, in schema order, stride B_r). Returns the CTR scores (sigmoid) float32 [B_r] for its slice."""
        self._agree(self._check_predict(dense_BF, kjt))
        dense_BF, kjt = dense_BF.to(self.device, torch.float32), kjt.to(self.device)
        sequence = None
        if self.schema.sequence_features:
            sparse, sequence = kjt.split([len(self.pooled_features), len(self.schema.sequence_features)])
        else:
            sparse = kjt
        return torch.sigmoid(self.model(dense_BF, sparse, sequence)).float().cpu()

    @torch.inference_mode()
    def lookup(self, feature: str, ids: Tensor) -> Tensor:
        """Collective: every rank calls it with the same feature and its own int64 ids (may be empty).
        Returns float32 [len(ids), dim]: the (dequantized) rows of that feature's table."""
        if feature not in self.schema.sparse_features:  # every rank has the same feature: all raise
            raise ValueError(f"lookup: unknown feature {feature!r}; features are {list(self.schema.sparse_features)}")
        collection = self.model.sequence if feature in self.schema.sequence_features else self.model.sparse
        names = (collection.hot or collection.routing).feature_names  # the caller's features (not F@hot)
        ids = ids.reshape(-1).to(self.device, torch.int64)
        # one bag of one id per requested id in this feature; the collection's other features get empty bags
        lengths = torch.zeros(len(names), ids.numel(), dtype=torch.int64, device=self.device)
        lengths[names.index(feature)] = 1
        kjt = KeyedJaggedTensor(keys=list(names), values=ids, lengths=lengths.reshape(-1), stride=ids.numel())
        out = collection(kjt)
        rows = out[feature] if isinstance(collection, ShardedEmbeddingBagCollection) else out[feature].values()
        return rows.float().cpu()

    def memory_bytes(self) -> Mapping[str, int]:
        """This rank's resident bytes: {"embedding_weights": ..., "dense_weights": ...}."""
        dense = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return {"embedding_weights": sum(c.memory_bytes() for c in _collections(self.model)), "dense_weights": dense}

    def _check_predict(self, dense_BF: Tensor, kjt: KeyedJaggedTensor) -> str | None:
        """What is wrong with this rank's predict input (before any collective), or None."""
        s = self.schema
        if dense_BF.dim() != 2 or dense_BF.shape[1] != s.num_dense:
            return f"predict: dense features must be [batch, {s.num_dense}], got {list(dense_BF.shape)}"
        if list(kjt.keys()) != list(s.sparse_features):
            return f"predict: the KeyedJaggedTensor's keys must be {list(s.sparse_features)} in this order, got {kjt.keys()}"
        if kjt.variable_stride_per_key() or kjt.stride() != dense_BF.shape[0]:
            return f"predict: {dense_BF.shape[0]} dense rows but a KeyedJaggedTensor of stride {kjt.stride()}; give both one row per sample"
        if TARGET_FEATURE in s.sequence_features:
            target = kjt.lengths().view(len(s.sparse_features), -1)[list(s.sparse_features).index(TARGET_FEATURE)]
            if bool((target != 1).any()):
                return f"predict: feature {TARGET_FEATURE!r} needs exactly one id per sample (the target item)"
        return None

    def _agree(self, error: str | None) -> None:
        """Raise ValueError on every rank if any rank's input is bad, so none is left inside a collective."""
        start_header(None, error, self.pg, self.device).result()


def merge_rank_errors(errors: list[str | None]) -> str:
    """Each rank's error (None: none) once: ranks with the same one are named together, and one that every
    rank found (a shared file) names none."""
    ranks: dict[str, list[int]] = {}
    for rank, error in enumerate(errors):
        if error:
            ranks.setdefault(error, []).append(rank)
    return "; ".join(error if len(found) == len(errors) else f"rank{'s' * (len(found) > 1)} {', '.join(map(str, found))}: "
                     f"{error}" for error, found in ranks.items())


def _collections(model: nn.Module) -> list[ShardedEmbeddingBagCollection | ShardedEmbeddingCollection]:
    return [m for m in model.modules() if isinstance(m, (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection))]


def _check_blocks(blocks: Mapping[str, tuple[Tensor, Tensor | None]], plan: ShardingPlan, info: ModelInfo, rank: int,
                  path: Path) -> None:
    """ArtifactError unless the rank file holds exactly this rank's blocks of the plan, in each table's dtype."""
    specs = {s.name: s for s in info.specs}
    for t in plan.tables:
        spec = specs.get(t.name)
        if spec is None:
            raise ArtifactError(f"{path.parent}: plan.json places table {t.name!r}, which model.json does not have; "
                                "export the artifact again")
        mine = [(t.name, s.num_rows, s.num_cols) for s in t.shards
                if s.rank == rank or t.sharding_type is ShardingType.DATA_PARALLEL][:1]
        if t.hot_rows:  # the hot rows' replica, on every rank
            mine.append((t.name + HOT, t.hot_rows, spec.embedding_dim))
        for name, rows, cols in mine:
            block = blocks.get(name)
            want = (STORED_DTYPE[spec.dtype], (rows, cols))
            if block is None or (block[0].dtype, tuple(block[0].shape)) != want or (block[1] is None) != (spec.dtype != "int8"):
                got = "nothing" if block is None else f"{block[0].dtype} {list(block[0].shape)}"
                raise ArtifactError(f"{path}: table {name!r} should hold a {spec.dtype} block of {rows}x{cols}, "
                                    f"found {got}; export the artifact again")


def _load_dense(model: nn.Module, dense: Mapping[str, Tensor], path: Path, device: torch.device) -> None:
    """The dense parameters from the artifact's tensors (every name and shape must match)."""
    params = dict(model.named_parameters())
    if set(params) != set(dense):
        raise ArtifactError(f"{path}: dense parameters {sorted(set(dense) ^ set(params))[:5]} do not match the model; "
                            "export the artifact again")
    for name, param in params.items():
        if dense[name].shape != param.shape:
            raise ArtifactError(f"{path}: {name} is {list(dense[name].shape)}, the model needs {list(param.shape)}")
        param.requires_grad_(False)
        with torch.no_grad():
            param.copy_(dense[name])
    model.to(device)
