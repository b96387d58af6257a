"""Correctness cases of the sharded runtime, run by every rank of one spawned group.

Each case builds tables, a plan and 5 steps of per-rank batches (seeded, so every rank
knows every rank's batch), runs the sharded collection on its own slice and the unsharded
TorchRec reference on the global batch, and returns the worst differences it saw. The
pytest side asserts on them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.comms import CommsPrecision
from embshard.planner.plan import ShardingPlan, TablePlacement
from embshard.planner.splits import col_splits, row_splits
from embshard.planner.types import COMPUTE_KERNEL, Shard, ShardingType
from embshard.runtime import OptimizerConfig, ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.state import assemble
from embshard.runtime.wire import TORCH_DTYPES
from embshard.specs import TableSpec
from embshard.topology import Topology
from rt_reference import ReferenceOptimizer, full_tables, global_batch, kjt, reference_ebc, reference_ec

ST = ShardingType
STEPS = 5
LR = 0.05

POOLED = [
    TableSpec("ta", 50, 8, feature_names=("a1", "a2"), optimizer="rowwise_adagrad"),
    TableSpec("tb", 37, 12, feature_names=("b",), optimizer="adagrad"),
    TableSpec("tc", 23, 16, feature_names=("c",), optimizer="sgd"),
    TableSpec("td", 61, 20, feature_names=("d",), optimizer="adam"),
]
SEQUENCE = [
    TableSpec("sa", 45, 16, pooled=False, feature_names=("s1", "s2"), optimizer="rowwise_adagrad"),
    TableSpec("sb", 29, 16, pooled=False, feature_names=("s3",), optimizer="adam"),
    TableSpec("sc", 33, 16, pooled=False, feature_names=("s4",), optimizer="sgd"),
    TableSpec("sd", 52, 16, pooled=False, feature_names=("s5",), optimizer="adagrad"),
]
# Widths that are not multiples of 4 (FBGEMM's kernels reject them; the torch kernel runs them).
ODD_POOLED = [
    TableSpec("ta", 50, 3, feature_names=("a1", "a2"), optimizer="rowwise_adagrad"),
    TableSpec("tb", 37, 6, feature_names=("b",), optimizer="adagrad"),
    TableSpec("tc", 23, 5, feature_names=("c",), optimizer="sgd"),
    TableSpec("td", 61, 3, feature_names=("d",), optimizer="adam"),
]
ODD_SEQUENCE = [  # one width: TorchRec's EmbeddingCollection (the reference) needs that
    TableSpec("sa", 45, 6, pooled=False, feature_names=("s1", "s2"), optimizer="rowwise_adagrad"),
    TableSpec("sb", 29, 6, pooled=False, feature_names=("s3",), optimizer="sgd"),
    TableSpec("sc", 33, 6, pooled=False, feature_names=("s4",), optimizer="adam"),
    TableSpec("sd", 52, 6, pooled=False, feature_names=("s5",), optimizer="adagrad"),
]
EMPTY_ON_LAST_RANK = {"b", "s3"}  # the last rank never has an id of these features
MEAN_TABLES = {"ta", "tc"}
MIXED_POOLED = [ShardingType.ROW_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL]
MIXED_SEQUENCE = [ShardingType.TABLE_ROW_WISE, ShardingType.DATA_PARALLEL, ShardingType.TABLE_COLUMN_WISE, ShardingType.TABLE_WISE]
FP16_TOL = 2e-3
# Quantized comms: (forward, backward) wire dtypes; the unit roundoff of each is eps / 2.
WIRE_CASES = (("fp16", "fp16"), ("bf16", "bf16"), ("fp16", "bf16"))
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


# ---- plans ------------------------------------------------------------------------------
def topology(world_size: int) -> Topology:
    return Topology(world_size=world_size, local_world_size=2 if world_size == 4 else world_size, device="cpu")


def uneven_rows(num_rows: int, ranks: list[int]) -> list[Shard]:
    """Row blocks of sizes 1:2:3:..., placed on ranks in reverse order (not TorchRec's even cut)."""
    k = len(ranks)
    cuts = [round(num_rows * sum(range(1, j + 1)) / sum(range(1, k + 1))) for j in range(k + 1)]
    return [Shard(r, cuts[j], cuts[j + 1] - cuts[j], 0, 0) for j, r in enumerate(reversed(ranks))]


def shards_for(spec: TableSpec, index: int, stype: ShardingType, topo: Topology, table_wise_rank: int | None = None) -> list[Shard]:
    N, D, W = spec.num_embeddings, spec.embedding_dim, topo.world_size
    host_ranks = list(topo.host_ranks(index % topo.num_hosts))
    if stype is ST.DATA_PARALLEL:
        return [Shard(r, 0, N, 0, D) for r in range(W)]
    if stype is ST.TABLE_WISE:
        return [Shard((index + 1) % W if table_wise_rank is None else table_wise_rank, 0, N, 0, D)]
    if stype.splits_rows:
        ranks = list(range(W)) if stype is ST.ROW_WISE else host_ranks
        if index % 2 == 0:
            return [dataclasses.replace(s, num_cols=D) for s in uneven_rows(N, ranks)]
        return [Shard(r, ro, n, 0, D) for r, (ro, n) in zip(ranks, row_splits(N, len(ranks)))]
    ranks = list(range(W)) if stype is ST.COLUMN_WISE else host_ranks
    if D % 4:  # two blocks, of 4 columns (FBGEMM's kernel, if the optimizer has one) and the rest, or halves
        first = 4 if D > 4 else D // 2
        return [Shard(ranks[(index + j) % len(ranks)], 0, N, co, n) for j, (co, n) in enumerate([(0, first), (first, D - first)])]
    ranks = [ranks[(index + j) % len(ranks)] for j in range(min(len(ranks), D // 4))]
    return [Shard(r, 0, N, co, n) for r, (co, n) in zip(ranks, col_splits(D, len(ranks)))]


def make_plan(specs: list[TableSpec], topo: Topology, types: list[ShardingType], table_wise_rank: int | None = None,
              modes: dict[str, str] | None = None) -> ShardingPlan:
    """modes: data-parallel table -> its data_parallel_mode (others: None, the topology's)."""
    tables = tuple(TablePlacement(s.name, t, COMPUTE_KERNEL[t], tuple(shards_for(s, i, t, topo, table_wise_rank)),
                                  (modes or {}).get(s.name))
                   for i, (s, t) in enumerate(zip(specs, types)))
    return ShardingPlan(tables=tables, specs=tuple(specs), topology=topo, ranks=(), lower_bound_ms=0.0, input_hash="")


# ---- batches ----------------------------------------------------------------------------
def make_batches(specs: list[TableSpec], world_size: int, weighted: bool, seed: int,
                 empty_ranks: bool = False, steps: int = STEPS) -> list[list[dict]]:
    """[step][rank] -> {feature: (lengths, ids, weights)}; rank r has 3 + 2r bags, some empty.
    empty_ranks: at step s, rank s % world_size has no bags at all (a serving share may be empty)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for step in range(steps):
        ranks = []
        for r in range(world_size):
            batch, B = {}, 0 if empty_ranks and r == step % world_size else 3 + 2 * r
            for s in specs:
                for f in s.feature_names:
                    lengths = torch.randint(0, 5, (B,), generator=gen)
                    lengths[:1] = 0  # an empty bag in every feature
                    if f in EMPTY_ON_LAST_RANK and r == world_size - 1:
                        lengths.zero_()
                    n = int(lengths.sum())
                    ids = torch.randint(0, s.num_embeddings, (n,), generator=gen)
                    weights = torch.rand(n, generator=gen) + 0.5 if weighted else None
                    batch[f] = (lengths, ids, weights)
            ranks.append(batch)
        batches.append(ranks)
    return batches


def features_of(specs: list[TableSpec]) -> list[str]:
    return [f for s in specs for f in s.feature_names]


# ---- the comparison ----------------------------------------------------------------------
def _column_blocks(plan: ShardingPlan) -> dict[str, list[tuple[int, int]]]:
    return {t.name: sorted({(s.col_offset, s.num_cols) for s in t.shards}) for t in plan.tables}


def make_collection(specs: list[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, pooled: bool,
                    weighted: bool = False, mean: bool = False, data_parallel_mode: str | None = None):
    pooling = {t: "mean" for t in MEAN_TABLES} if mean else {}
    config = OptimizerConfig(learning_rate=LR)
    if pooled:
        return ShardedEmbeddingBagCollection(specs, plan, pg, pooling=pooling, weighted=weighted, optimizer=config,
                                             data_parallel_mode=data_parallel_mode)
    return ShardedEmbeddingCollection(specs, plan, pg, optimizer=config, data_parallel_mode=data_parallel_mode)


def make_reference(specs: list[TableSpec], tables: dict[str, Tensor], pooled: bool, weighted: bool = False, mean: bool = False):
    pooling = {t: "mean" for t in MEAN_TABLES} if mean else {}
    return reference_ebc(specs, tables, pooling, weighted) if pooled else reference_ec(specs, tables)


def train(specs: list[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *, pooled: bool,
          weighted: bool = False, mean: bool = False, seed: int = 0, data_parallel_mode: str | None = None,
          empty_ranks: bool = False, eval_forwards: bool = False, steps: int = STEPS):
    """Forward + ``steps`` (5) fused updates, sharded vs reference: (sharded, reference, reference optimizer, errors).
    eval_forwards: after each update, forwards without backward (no-grad, and in eval mode) that must change nothing."""
    rank, W = dist.get_rank(pg), dist.get_world_size(pg)
    tables = full_tables(specs, seed)
    sharded = make_collection(specs, plan, pg, pooled, weighted, mean, data_parallel_mode)
    sharded.load_tables(tables)
    ref = make_reference(specs, tables, pooled, weighted, mean)
    ref_opt = ReferenceOptimizer(specs, LR, column_blocks=_column_blocks(plan))
    feats = features_of(specs)
    errors = {"err_forward": 0.0}
    gen = torch.Generator().manual_seed(seed + 1)
    # The output gradients (the loss's targets) as the wire carries them: summed per row, rounded targets
    # that nearly cancel may cancel exactly (or not), and adagrad / adam's first step, lr g / |g|, is not
    # within u of the fp32 one then (a row of w4-wire-fp16-fp16-mixed-sequence: fp32 sum 6.6e-6, fp16 0).
    wire_grad = TORCH_DTYPES[plan.topology.comms.backward]
    for step, batches in enumerate(make_batches(specs, W, weighted, seed, empty_ranks, steps)):
        if step == 3:  # the learning rate can change between steps
            sharded.set_learning_rate(LR / 2)
            ref_opt.lr = LR / 2
        out = sharded(kjt(batches[rank], feats, weighted))
        ref_out = ref(kjt(global_batch(batches), feats, weighted))
        ref_loss = 0.0
        for r in range(W):
            targets = _targets(specs, batches[r], pooled, gen)
            ref_slice = _rank_slice(ref_out, batches, r, feats, pooled)
            ref_loss = ref_loss + _loss(ref_slice, _on_wire(targets, wire_grad), pooled) / W
            if r == rank:
                errors["err_forward"] = max(errors["err_forward"], _max_diff(out, ref_slice, pooled))
                loss = _loss(out, targets, pooled)
        loss.backward()
        ref_loss.backward()
        touched = {s.name: torch.cat([global_batch(batches)[f][1] for f in s.feature_names]) for s in specs}
        ref_opt.step(ref_weights(ref, specs), touched)
        if eval_forwards:
            with torch.no_grad():
                sharded(kjt(batches[rank], feats, weighted))
            sharded.eval()
            sharded(kjt(batches[rank], feats, weighted))  # a graph that is never backpropagated
            sharded.train()
    errors.update(compare_shards(sharded, ref, ref_opt, specs))
    errors["moved"] = max(float((shard.weight - tables[name][shard.rows, shard.cols]).abs().max())
                          for name, shard in sharded.state_dict().items())
    return sharded, ref, ref_opt, errors


def ref_weights(ref, specs: list[TableSpec]) -> dict[str, Tensor]:
    modules = ref.embedding_bags if hasattr(ref, "embedding_bags") else ref.embeddings
    return {s.name: modules[s.name].weight for s in specs}


def compare_shards(sharded, ref, ref_opt: ReferenceOptimizer, specs: list[TableSpec]) -> dict[str, float]:
    errors = {"err_weights": 0.0, "err_optimizer_state": 0.0}
    weights = ref_weights(ref, specs)
    for name, shard in sharded.state_dict().items():
        errors["err_weights"] = max(errors["err_weights"], float((shard.weight - weights[name][shard.rows, shard.cols]).abs().max()))
        for key, value in shard.optimizer_state.items():
            expected = ref_opt.block_state(name, key, shard.rows, shard.cols, value.dim())
            errors["err_optimizer_state"] = max(errors["err_optimizer_state"], float((value.float() - expected.float()).abs().max()))
    return errors


def run_training(specs: list[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, **kwargs) -> dict[str, float]:
    return train(specs, plan, pg, **kwargs)[3]


def wire_tolerances(forward: str, backward: str) -> dict[str, float]:
    """Bounds on a quantized-comms case's errors against the fp32 reference, from the formats' unit roundoff u (eps / 2).

    Forward: every wire value (a pooled sum, a row-wise partial sum, a row) is rounded once, |error| <= u |value|;
    a bag sums at most 4 ids of |x| < 1.5 (tables 0.3 x randn, per-id weights < 1.5), and a row-wise bag arrives as
    at most 2 rounded partial sums here: < 4 x 1.5 x 2 u. Backward: the reference trains on the targets rounded to the
    wire dtype (`train`: a row's gradient sums them, and a sum of rounded terms that cancel has no relative bound, which
    the normalised optimizers' first step, lr g / |g|, would show); what is left is rounded once more at most (relative
    u: mean pooling's scale, the data-parallel all-reduce; the loss is linear, so forward rounding does not reach the
    gradients), |g| < 4 (randn targets): a step moves a weight by at most lr |g| u (sgd) or about 2 lr u (adagrad/adam,
    normalised), 5 steps at lr = 0.05: < 5 x 0.05 x 4 x 2 u = 2 u; adagrad's sum of squared gradients errs by 2u g^2
    per step: < 5 x 16 x 2 u = 160 u.
    """
    uf, ub = UNIT_ROUNDOFF[forward], UNIT_ROUNDOFF[backward]
    return {"tolerance_err_forward": 12 * uf, "tolerance_err_weights": 2 * ub, "tolerance_err_optimizer_state": 160 * ub}


def run_quantized(specs: list[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, **kwargs) -> dict[str, float]:
    """A quantized-comms run against the fp32 reference: within the wire formats' rounding, and visibly rounded."""
    errors = run_training(specs, plan, pg, **kwargs)
    comms = plan.topology.comms
    return {**errors, **wire_tolerances(comms.forward, comms.backward),
            "rounded": errors["err_forward"] + errors["err_weights"]}


def run_mode_of_topology(specs: list[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup) -> dict[str, float]:
    """Without data_parallel_mode the collection trains as its plan's topology says (replicated look-ups here)."""
    sharded, _, _, errors = train(specs, plan, pg, pooled=True, mean=True, seed=13)
    assert plan.topology.data_parallel_mode == "replicated_lookup"
    errors["err_mode"] = float(sharded.dense_replicas is not None)
    return errors


def run_mixed_modes(specs: list[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, **kwargs) -> dict[str, float]:
    """Data-parallel tables in both modes in one collection, each as its placement says."""
    sharded, _, _, errors = train(specs, plan, pg, **kwargs)
    errors["err_groups"] = float([g.local for g in sharded.replica_groups] != [True, False])
    return errors


def run_state_roundtrip(plan: ShardingPlan, other_plan: ShardingPlan, pg: dist.ProcessGroup) -> dict[str, float]:
    """Train, then: reassemble tables from every rank's shards; load them into another plan;
    restore shards + optimizer state into the same plan and take one more step on both."""
    return roundtrip_errors(plan, other_plan, plan, pg, seed=11)


def roundtrip_errors(plan: ShardingPlan, other_plan: ShardingPlan, restore_plan: ShardingPlan, pg: dist.ProcessGroup,
                     seed: int) -> dict[str, float]:
    """POOLED trained under ``plan`` (seeds seed..seed+2), then: its tables reassembled from every rank's shards
    (against the reference); loaded whole into ``other_plan`` (forward against the reference); its shards and
    optimizer state restored into ``restore_plan``, forward and one more step beside the trained one."""
    rank, W = dist.get_rank(pg), dist.get_world_size(pg)
    sharded, ref, ref_opt, errors = train(POOLED, plan, pg, pooled=True, seed=seed)
    shards = sharded.state_dict()
    gathered: list = [None] * W
    dist.all_gather_object(gathered, list(shards.values()), group=pg)
    weights = ref_weights(ref, POOLED)
    full = {s.name: assemble([x for part in gathered for x in part if x.table == s.name]) for s in POOLED}
    errors["err_assembled"] = max(float((full[n] - weights[n]).abs().max()) for n in full)
    batches = make_batches(POOLED, W, False, seed=seed + 1)[0]
    feats = features_of(POOLED)
    expected = _rank_slice(ref(kjt(global_batch(batches), feats, False)), batches, rank, feats, True)
    resharded = make_collection(POOLED, other_plan, pg, pooled=True)
    resharded.load_state_dict(full)
    errors["err_resharded_forward"] = _max_diff(resharded(kjt(batches[rank], feats, False)), expected, True)
    restored = make_collection(POOLED, restore_plan, pg, pooled=True)
    restored.load_state_dict(shards)
    restored.set_learning_rate(LR / 2)  # as train() left it: the learning rate is a setting, not state
    errors["err_restored_forward"] = _max_diff(restored(kjt(batches[rank], feats, False)), expected, True)
    gen = torch.Generator().manual_seed(seed + 2)
    target = _targets(POOLED, batches[rank], True, gen)
    for module in (sharded, restored):
        _loss(module(kjt(batches[rank], feats, False)), target, True).backward()
    after, again = sharded.state_dict(), restored.state_dict()
    errors["err_restored_step"] = max(
        max(float((after[n].weight - again[n].weight).abs().max()) for n in after),
        max((float((after[n].optimizer_state[k].float() - again[n].optimizer_state[k].float()).abs().max())
             for n in after for k in after[n].optimizer_state), default=0.0))
    return errors


def _targets(specs, batch, pooled: bool, gen: torch.Generator):
    if pooled:
        B = len(next(iter(batch.values()))[0])
        return torch.randn(B, sum(s.embedding_dim * s.num_features for s in specs), generator=gen)
    return {f: torch.randn(len(batch[f][1]), s.embedding_dim, generator=gen) for s in specs for f in s.feature_names}


def _on_wire(targets, dtype: torch.dtype):
    """Targets rounded to the wire dtype of the output gradients (the identity for fp32)."""
    if isinstance(targets, Tensor):
        return targets.to(dtype).float()
    return {f: t.to(dtype).float() for f, t in targets.items()}


def _rank_slice(ref_out, batches, r: int, feats: list[str], pooled: bool):
    """Rank r's part of the reference output on the global batch."""
    if pooled:
        first = sum(len(b[feats[0]][0]) for b in batches[:r])
        return ref_out.values()[first:first + len(batches[r][feats[0]][0])]
    out = {}
    for f in feats:
        first = sum(len(b[f][1]) for b in batches[:r])
        out[f] = ref_out[f].values()[first:first + len(batches[r][f][1])]
    return out


def _loss(out, targets, pooled: bool) -> Tensor:
    if pooled:
        values = out if isinstance(out, Tensor) else out.values()
        return (values * targets).sum()
    return sum(((out[f] if isinstance(out[f], Tensor) else out[f].values()) * t).sum() for f, t in targets.items())


def _max_diff(out, ref_slice, pooled: bool) -> float:
    if pooled:
        return float((out.values().detach() - ref_slice).abs().max()) if ref_slice.numel() else 0.0
    worst = 0.0
    for f, expected in ref_slice.items():
        got = out[f].values().detach()
        if got.shape != expected.shape:
            return float("inf")
        if got.numel():
            worst = max(worst, float((got - expected).abs().max()))
    return worst


CaseFn = Callable[[dist.ProcessGroup], dict[str, float]]


def training_cases(world_size: int) -> dict[str, CaseFn]:
    topo = topology(world_size)
    cases: dict[str, CaseFn] = {}
    for stype in ShardingType:
        for pooled, specs in ((True, POOLED), (False, SEQUENCE)):
            plan = make_plan(specs, topo, [stype] * len(specs))
            kind = "pooled" if pooled else "sequence"
            cases[f"{stype.value}-{kind}"] = (lambda pg, s=specs, p=plan, pooled=pooled:
                                              run_training(s, p, pg, pooled=pooled, mean=pooled))
            if pooled:
                cases[f"{stype.value}-pooled-weighted"] = (lambda pg, s=specs, p=plan:
                                                           run_training(s, p, pg, pooled=True, weighted=True, seed=3))
    mixed_pooled = make_plan(POOLED, topo, MIXED_POOLED)
    mixed_sequence = make_plan(SEQUENCE, topo, MIXED_SEQUENCE)
    cases["mixed-pooled"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, mean=True, seed=5)
    cases["mixed-pooled-weighted"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, weighted=True, seed=6)
    cases["mixed-sequence"] = lambda pg: run_training(SEQUENCE, mixed_sequence, pg, pooled=False, seed=7)
    # Empty local batches (at step s rank s % W has no bags): every pooling mode, forward and backward.
    empty = dict(empty_ranks=True)
    cases["empty-rank-sum"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, seed=21, **empty)
    cases["empty-rank-mean"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, mean=True, seed=22, **empty)
    cases["empty-rank-weighted"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, weighted=True, seed=23, **empty)
    cases["empty-rank-weighted-mean"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, weighted=True,
                                                                 mean=True, seed=24, **empty)
    cases["empty-rank-sequence"] = lambda pg: run_training(SEQUENCE, mixed_sequence, pg, pooled=False, seed=25, **empty)
    cases["empty-rank-mean-replicated_lookup"] = lambda pg: run_training(
        POOLED, mixed_pooled, pg, pooled=True, mean=True, seed=26, data_parallel_mode="replicated_lookup", **empty)
    cases["empty-rank-sequence-replicated_lookup"] = lambda pg: run_training(
        SEQUENCE, mixed_sequence, pg, pooled=False, seed=27, data_parallel_mode="replicated_lookup", **empty)
    cases["mixed-pooled-weighted-mean"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, weighted=True,
                                                                   mean=True, seed=28)
    # Forwards between steps (eval, no-grad) do not count as updates: adam's bias correction stays the reference's.
    evals = dict(eval_forwards=True)
    cases["eval-forwards-pooled"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, mean=True, seed=37, **evals)
    cases["eval-forwards-sequence"] = lambda pg: run_training(SEQUENCE, mixed_sequence, pg, pooled=False, seed=38, **evals)
    cases["eval-forwards-pooled-replicated_lookup"] = lambda pg: run_training(
        POOLED, mixed_pooled, pg, pooled=True, seed=39, data_parallel_mode="replicated_lookup", **evals)
    # Any width trains, in every sharding type (column blocks too).
    odd_pooled = make_plan(ODD_POOLED, topo, [ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE, ST.DATA_PARALLEL])
    odd_sequence = make_plan(ODD_SEQUENCE, topo, [ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE, ST.DATA_PARALLEL, ST.TABLE_WISE])
    cases["odd-dims-pooled"] = lambda pg: run_training(ODD_POOLED, odd_pooled, pg, pooled=True, mean=True, seed=31)
    cases["odd-dims-pooled-weighted"] = lambda pg: run_training(ODD_POOLED, odd_pooled, pg, pooled=True, weighted=True, seed=32)
    cases["odd-dims-sequence"] = lambda pg: run_training(ODD_SEQUENCE, odd_sequence, pg, pooled=False, seed=33)
    cases["odd-dims-pooled-replicated_lookup"] = lambda pg: run_training(
        ODD_POOLED, odd_pooled, pg, pooled=True, mean=True, seed=34, data_parallel_mode="replicated_lookup")
    # fp16 weights: rounded after every update, so compared with the fp32 reference at fp16's tolerance.
    fp16_pooled, fp16_sequence = ([dataclasses.replace(s, dtype="fp16") for s in specs] for specs in (POOLED, SEQUENCE))
    cases["fp16-mixed-pooled"] = lambda pg: {**run_training(fp16_pooled, make_plan(fp16_pooled, topo, MIXED_POOLED), pg,
                                                            pooled=True, mean=True, seed=35), "tolerance": FP16_TOL}
    cases["fp16-mixed-sequence"] = lambda pg: {**run_training(fp16_sequence, make_plan(fp16_sequence, topo, MIXED_SEQUENCE), pg,
                                                              pooled=False, seed=36), "tolerance": FP16_TOL}
    # One optimizer for all tables: each rank's blocks share kernels (several tables per kernel).
    for optimizer in ("rowwise_adagrad", "adam"):
        for pooled, specs in ((True, POOLED), (False, SEQUENCE)):
            same = [dataclasses.replace(s, optimizer=optimizer) for s in specs]
            plan = make_plan(same, topo, [ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE], table_wise_rank=0)
            kind = "pooled" if pooled else "sequence"
            cases[f"shared-kernels-{optimizer}-{kind}"] = (lambda pg, s=same, p=plan, pooled=pooled:
                                                           run_training(s, p, pg, pooled=pooled, mean=pooled, seed=9))
    # The cases above train data-parallel tables "allreduce" (their topology's mode); these force each
    # mode (per-table kernels above, several tables per kernel here) or take it from the topology.
    replicated = dict(data_parallel_mode="replicated_lookup")
    for pooled, specs, kind in ((True, POOLED, "pooled"), (False, SEQUENCE, "sequence")):
        plan = make_plan(specs, topo, [ST.DATA_PARALLEL] * len(specs))
        cases[f"data_parallel-{kind}-replicated_lookup"] = (lambda pg, s=specs, p=plan, pooled=pooled:
                                                            run_training(s, p, pg, pooled=pooled, mean=pooled, **replicated))
    dp_pooled = make_plan(POOLED, topo, [ST.DATA_PARALLEL] * len(POOLED))
    cases["data_parallel-pooled-weighted-replicated_lookup"] = (lambda pg: run_training(
        POOLED, dp_pooled, pg, pooled=True, weighted=True, seed=3, **replicated))
    cases["mixed-pooled-replicated_lookup"] = lambda pg: run_training(POOLED, mixed_pooled, pg, pooled=True, mean=True,
                                                                       seed=5, **replicated)
    cases["mixed-sequence-replicated_lookup"] = lambda pg: run_training(SEQUENCE, mixed_sequence, pg, pooled=False,
                                                                         seed=7, **replicated)
    for mode in ("allreduce", "replicated_lookup"):
        for optimizer, pooled, specs in (("rowwise_adagrad", True, POOLED), ("adam", False, SEQUENCE)):
            same = [dataclasses.replace(s, optimizer=optimizer) for s in specs]
            plan = make_plan(same, topo, [ST.DATA_PARALLEL] * len(same))
            kind = "pooled" if pooled else "sequence"
            cases[f"data_parallel-shared-kernels-{optimizer}-{kind}-{mode}"] = (
                lambda pg, s=same, p=plan, pooled=pooled, m=mode:
                run_training(s, p, pg, pooled=pooled, weighted=pooled, seed=11, data_parallel_mode=m))
    replicated_topo = dataclasses.replace(topo, replicated_dp_lookup=True)
    cases["data_parallel-mode-of-topology"] = lambda pg: run_mode_of_topology(
        POOLED, make_plan(POOLED, replicated_topo, [ST.DATA_PARALLEL] * len(POOLED)), pg)
    # Per-table modes (as the planner records them), both in one collection, next to sharded tables;
    # the "same" variants put tables of both modes in kernels of one optimizer.
    pooled_modes = {"ta": "allreduce", "tb": "replicated_lookup", "td": "replicated_lookup"}
    sequence_modes = {"sa": "replicated_lookup", "sc": "allreduce", "sd": "replicated_lookup"}
    for kind, specs, types, modes in (
            ("pooled", POOLED, [ST.DATA_PARALLEL, ST.DATA_PARALLEL, ST.ROW_WISE, ST.DATA_PARALLEL], pooled_modes),
            ("sequence", SEQUENCE, [ST.DATA_PARALLEL, ST.TABLE_WISE, ST.DATA_PARALLEL, ST.DATA_PARALLEL], sequence_modes)):
        same = [dataclasses.replace(s, optimizer="rowwise_adagrad") for s in specs]
        for variant, tables in (("", specs), ("-same-optimizer", same)):
            plan = make_plan(tables, topo, types, modes=modes)
            pooled = kind == "pooled"
            cases[f"data_parallel-modes-per-table-{kind}{variant}"] = (
                lambda pg, s=tables, p=plan, pooled=pooled: run_mixed_modes(s, p, pg, pooled=pooled, weighted=pooled,
                                                                           seed=41, empty_ranks=True))
    # Quantized communication: embeddings and gradients on the wire as fp16 / bf16, data-parallel all-reduce too.
    for forward, backward in WIRE_CASES:
        wire = dataclasses.replace(topo, comms=CommsPrecision(forward, backward, dp_allreduce=backward))
        name = f"wire-{forward}-{backward}"
        cases[f"{name}-mixed-pooled"] = (lambda pg, t=wire: run_quantized(
            POOLED, make_plan(POOLED, t, MIXED_POOLED), pg, pooled=True, mean=True, seed=41))
        cases[f"{name}-mixed-sequence"] = (lambda pg, t=wire: run_quantized(
            SEQUENCE, make_plan(SEQUENCE, t, MIXED_SEQUENCE), pg, pooled=False, seed=42))
    wire = dataclasses.replace(topo, comms=CommsPrecision("bf16", "fp16"))
    cases["wire-bf16-fp16-mixed-pooled-weighted-replicated_lookup"] = lambda pg: run_quantized(
        POOLED, make_plan(POOLED, wire, MIXED_POOLED), pg, pooled=True, weighted=True, seed=43, **replicated)
    if topo.num_hosts > 1:  # flat collectives across hosts (topology.reduce_in_host off) train exactly too
        flat = dataclasses.replace(topo, reduce_in_host=False)
        cases["flat-mixed-pooled"] = lambda pg: run_training(POOLED, make_plan(POOLED, flat, MIXED_POOLED), pg, pooled=True,
                                                             mean=True, seed=44)
        cases["flat-table_row_wise-pooled-weighted"] = lambda pg: run_training(
            POOLED, make_plan(POOLED, flat, [ST.TABLE_ROW_WISE] * len(POOLED)), pg, pooled=True, weighted=True, seed=45)
    all_table_wise = make_plan(POOLED, topo, [ST.TABLE_WISE] * len(POOLED))
    cases["state-roundtrip"] = lambda pg: run_state_roundtrip(mixed_pooled, all_table_wise, pg)
    return cases
