"""Training data: a seeded synthetic Criteo-like stream and readers of the real Criteo formats.

    stream = open_stream(SyntheticConfig(), layout, rank, world_size, batch_size, "train")   # embshard.data.stream
    batch = next(stream)    # Batch: dense, sparse KeyedJaggedTensor, labels (this rank's slice)

This package's own namespace holds only the (torch-free) settings, so a launcher can check
a config without importing torch.
"""

from embshard.data.config import CriteoNpyConfig, CriteoTsvConfig, DataConfig, SyntheticConfig

__all__ = ["CriteoNpyConfig", "CriteoTsvConfig", "DataConfig", "SyntheticConfig"]
