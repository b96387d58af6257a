"""Small table sets and model settings shared by the training tests."""

from __future__ import annotations

# Six small tables; the 2-rank runs put each on a different sharding type (see test_training_runs.py).
TINY = """# @package _global_
tables:
  - {name: t0, num_embeddings: 300, embedding_dim: 8, optimizer: rowwise_adagrad}
  - {name: t1, num_embeddings: 200, embedding_dim: 8, optimizer: rowwise_adagrad}
  - {name: t2, num_embeddings: 100, embedding_dim: 8, pooling_factor: 3.0, optimizer: adagrad}
  - {name: t3, num_embeddings: 50, embedding_dim: 8, optimizer: rowwise_adagrad}
  - {name: t4, num_embeddings: 400, embedding_dim: 8, pooling_factor: 2.0, optimizer: sgd}
  - {name: t5, num_embeddings: 80, embedding_dim: 8, optimizer: adam}
"""
# The same tables with a larger t2, and one table fewer: checkpoints of TINY must be refused.
LARGER = TINY.replace("t2, num_embeddings: 100,", "t2, num_embeddings: 120,")
FEWER = "\n".join(line for line in TINY.splitlines() if "t5" not in line) + "\n"
# The model that fits them: dense vector of width 8 (= the tables' dim for the dot interaction).
MODEL = ["model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]"]
FAST_PLANNER = ["planner.time_budget_s=0.5", "planner.use_ilp=false"]


def criteo_like(num_rows: int = 100) -> str:
    """26 small tables, one per Criteo categorical feature (the Criteo readers need exactly 26)."""
    rows = "\n".join(f"  - {{name: cat_{i}, num_embeddings: {num_rows + i}, embedding_dim: 8}}" for i in range(26))
    return f"# @package _global_\ntables:\n{rows}\n"
