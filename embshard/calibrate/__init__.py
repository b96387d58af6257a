"""Measuring this machine for the planner: timed kernels and collectives, a fit of the cost terms, a topology profile."""

from embshard.extras import require

require("embshard-calibrate (embshard.calibrate)", "torch")
