"""DLRM training on sharded embedding tables: a Hydra app (`embshard-train`, configs/train.yaml)."""
