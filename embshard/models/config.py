"""Settings of the models (frozen values; Hydra's schema for configs/model/ is derived from them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from embshard.specs import TableSpec

INTERACTIONS = ("dot", "dcn")
HISTORY_FEATURE, TARGET_FEATURE = "history", "target"


@dataclass(frozen=True)
class SequenceConfig:
    """The user-history feature: ``max_history_length`` items of ``num_items`` (a sequence
    table named ``table``, width bottom_mlp[-1]), plus the target item, from the same table."""

    enabled: bool = False
    table: str = "item"
    num_items: int = 10_000
    max_history_length: int = 20

    def table_spec(self, dim: int, optimizer: str) -> TableSpec:
        # Ids per sample and feature, on average: the history's (1..L uniform) and the target's 1.
        mean_ids = ((self.max_history_length + 1) / 2 + 1) / 2
        return TableSpec(self.table, self.num_items, dim, pooling_factor=mean_ids, pooled=False,
                         feature_names=(HISTORY_FEATURE, TARGET_FEATURE), optimizer=optimizer)


@dataclass(frozen=True)
class DLRMConfig:
    interaction: str = "dot"
    bottom_mlp: tuple[int, ...] = (64, 16)  # the last width is the dense vector's (= embedding dim for dot)
    top_mlp: tuple[int, ...] = (256, 128, 1)  # the last layer gives the logit
    dcn_num_layers: int = 3
    dcn_low_rank: int = 64
    sequence: SequenceConfig = field(default_factory=SequenceConfig)

    def __post_init__(self) -> None:
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"model.interaction: must be one of {list(INTERACTIONS)}, got {self.interaction!r}")
        for key in ("bottom_mlp", "top_mlp"):
            sizes = getattr(self, key)
            if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
                raise ValueError(f"model.{key}: must be a non-empty list of positive layer widths, got {list(sizes)}")
        if self.top_mlp[-1] != 1:
            raise ValueError(f"model.top_mlp: the last layer must have width 1 (the logit), got {list(self.top_mlp)}")
        for key in ("dcn_num_layers", "dcn_low_rank"):
            if getattr(self, key) <= 0:
                raise ValueError(f"model.{key}: must be positive, got {getattr(self, key)}")
        s = self.sequence
        if s.enabled and (s.num_items <= 0 or s.max_history_length <= 0):
            raise ValueError(f"model.sequence: num_items and max_history_length must be positive, got {s.num_items}, "
                             f"{s.max_history_length}")

    @property
    def dense_dim(self) -> int:
        return self.bottom_mlp[-1]
