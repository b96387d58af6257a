"""embshard: embedding sharding engine for recommendation models (planner, runtime, training, serving)."""

__version__ = "0.1.0"
