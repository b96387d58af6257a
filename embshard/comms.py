"""Precision of embeddings on the wire (quantized communication), like TorchRec's `QCommsConfig`.

Output dist sends pooled embeddings (or one row per id) in ``forward`` and their gradients
in ``backward``; data-parallel tables all-reduce their weight gradients in ``dp_allreduce``.
Each is cast to its wire dtype before the collective and back to fp32 after it
(embshard.runtime.wire); the cost model prices ``bytes_per_element`` of each
(embshard.planner.cost.perf). Set with ``planner.comms.*``; a plan records it in its
topology (``topology.comms`` in plan.json). No torch here: the planner runs without it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

# Bytes per element of every wire dtype: the one table the cost model and the runtime share.
WIRE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class CommsPrecision:
    forward: str = "fp32"       # embeddings in output dist
    backward: str = "fp32"      # their gradients
    dp_allreduce: str = "fp32"  # data-parallel tables' gradient all-reduce ("allreduce" mode)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in WIRE_BYTES:
                raise ValueError(f"comms.{f.name}: {value!r} is not a wire dtype; give one of {list(WIRE_BYTES)} "
                                 f"(e.g. planner.comms.{f.name}=fp16)")

    def bytes_per_element(self, direction: str) -> int:
        """Bytes of one element on the wire: direction is 'forward', 'backward' or 'dp_allreduce'."""
        return WIRE_BYTES[getattr(self, direction)]

    @property
    def quantized(self) -> bool:
        return any(getattr(self, f.name) != "fp32" for f in fields(self))

    @classmethod
    def from_dict(cls, raw: Any, where: str = "comms") -> "CommsPrecision":
        if isinstance(raw, CommsPrecision):
            return raw
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping with keys {[f.name for f in fields(cls)]}, got {raw!r}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed keys are {known}")
        try:
            return cls(**raw)
        except ValueError as e:
            raise ValueError(f"{where}.{str(e).removeprefix('comms.')}") from None
