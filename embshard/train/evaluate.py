"""Evaluation: AUC (torchmetrics, synced over ranks) and log loss over a fixed eval set, each sample once.

Every rank takes part in each forward (the sharded model's collectives need all of them):
a rank whose share ran out, or whose part of the last global batch is empty, runs an empty
batch. The pass ends when no rank has samples left, so the same weights give the same
metrics and the same count on any number of ranks.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import BinaryAUROC

from embshard.data.batch import Batch, FeatureLayout, Samples, to_batch
from embshard.launch.distributed import RankContext, all_sum


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterator[Batch], layout: FeatureLayout, ctx: RankContext) -> dict[str, float]:
    """{"auc", "logloss", "samples"} of the model over every rank's ``batches`` (an eval pass)."""
    sync = {"process_group": ctx.pg} if ctx.pg is not None else {"sync_on_compute": False}
    auroc = BinaryAUROC(**sync).to(ctx.device)
    empty = None
    loss_sum, num_samples = 0.0, 0  # this rank's
    model.eval()
    try:
        while True:
            batch = next(batches, None)
            if all_sum(ctx, [float(batch is not None)])[0] == 0:
                break
            if batch is None:
                if empty is None:
                    empty = to_batch(Samples.empty(layout), layout)
                batch = empty
            batch = batch.to(ctx.device)
            logits = model(batch.dense, batch.sparse, batch.sequence)
            auroc.update(torch.sigmoid(logits), batch.labels.int())
            loss_sum += float(F.binary_cross_entropy_with_logits(logits.double(), batch.labels.double(), reduction="sum"))
            num_samples += batch.size
        loss_sum, total = all_sum(ctx, [loss_sum, float(num_samples)])
        if total == 0:
            raise ValueError("eval: the eval set holds no valid samples; check data.eval_files / eval_days "
                             "(or eval.num_samples)")
        return {"auc": float(auroc.compute()), "logloss": loss_sum / total, "samples": int(total)}
    finally:
        model.train()
