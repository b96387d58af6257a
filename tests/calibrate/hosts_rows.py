"""A torchrun rank that measures the collectives between hosts (embshard.calibrate.hosts); rank 0 writes the rows to ARGV[1]."""

import json
import sys
from pathlib import Path

from embshard.calibrate.hosts import measure_across_hosts

rows = measure_across_hosts({"timeout_s": 60, "collectives": {"sizes_bytes": [1000, 1_000_000], "reps": 3, "warmup": 1}}, "cpu")
if rows is not None:
    Path(sys.argv[1]).write_text(json.dumps(rows))
