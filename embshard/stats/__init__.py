"""embshard-stats: per-table access statistics measured from the training data (numpy, no torch)."""
