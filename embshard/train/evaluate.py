"""Evaluation: AUC and log loss over ``num_batches`` batches per rank (torchmetrics, synced over ranks)."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import BinaryAUROC

from embshard.data.stream import Stream
from embshard.train.distributed import RankContext


@torch.no_grad()
def evaluate(model: nn.Module, stream: Stream, num_batches: int, ctx: RankContext) -> dict[str, float]:
    sync = {"process_group": ctx.pg} if ctx.pg is not None else {"sync_on_compute": False}
    auroc = BinaryAUROC(**sync).to(ctx.device)
    logloss = MeanMetric(**sync).to(ctx.device)
    model.eval()
    try:
        for batch in itertools.islice(stream, num_batches):
            batch = batch.to(ctx.device)
            logits = model(batch.dense, batch.sparse, batch.sequence)
            auroc.update(torch.sigmoid(logits), batch.labels.int())
            logloss.update(F.binary_cross_entropy_with_logits(logits, batch.labels, reduction="none"))
        return {"auc": float(auroc.compute()), "logloss": float(logloss.compute())}
    finally:
        model.train()
