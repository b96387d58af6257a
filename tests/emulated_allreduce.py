"""A timed gloo all-reduce of $MB MiB between the ranks (run by torchrun on emulated hosts)."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
size_bytes = int(os.environ.get("MB", "16")) * 2**20
t = torch.ones(size_bytes // 4)
dist.all_reduce(t)  # connects every pair first
dist.barrier()
t0 = time.perf_counter()
dist.all_reduce(t)
elapsed_s = time.perf_counter() - t0
assert float(t[0]) == world * world and float(t[-1]) == world * world
# A ring all-reduce sends 2 (W - 1) / W of the buffer from every rank.
sent_bytes = 2 * (world - 1) / world * size_bytes
print(f"rank {rank}: all_reduce {size_bytes} B in {elapsed_s:.3f} s: {sent_bytes * 8 / elapsed_s / 1e9:.3f} Gbit/s sent",
      flush=True)
dist.destroy_process_group()
