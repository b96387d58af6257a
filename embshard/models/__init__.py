"""Recommendation models built on TorchRec's unsharded embedding modules (`shard_model` swaps them).

embshard.models.dlrm: DLRM (dot or DCNv2 interaction, optional sequence features); embshard.models.config: their settings.
"""

from embshard.extras import require

require("embshard.models", "torch")
