"""embshard <-> TorchRec: table configs, sharding plans, topology and TorchRec's cost model."""

from embshard.extras import require

require("embshard.interop", "torch")
