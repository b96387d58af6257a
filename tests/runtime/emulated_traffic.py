"""Run by torchrun on emulated hosts: three traffic cases of rt_traffic.py (one pooled, one
sequence, one with hot rows), each rank's counted and predicted bytes written to $OUT/rank<R>.json."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import rt_traffic  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo")
cases = rt_traffic.cases(dist.get_world_size())
results = {name: cases[name](dist.group.WORLD) for name in ("traffic-pooled-0", "traffic-sequence-1", "traffic-hot-sequence-1")}
Path(os.environ["OUT"], f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
dist.destroy_process_group()
