"""DLRM training on sharded embedding tables: a Hydra app (`embshard-train`, configs/train.yaml)."""

from embshard.extras import require

require("embshard-train (embshard.train)", "torch")
