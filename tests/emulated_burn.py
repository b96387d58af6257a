"""Burn 0.3 s of CPU and print how long it took on the wall clock and the cpu cgroup this rank runs in
(run by torchrun on emulated hosts with capped ranks)."""

import os
import time

wall, cpu = time.perf_counter(), time.process_time()
while time.process_time() - cpu < 0.3:
    pass
ratio = (time.perf_counter() - wall) / (time.process_time() - cpu)
group = next(line.split(":", 2)[2] for line in open("/proc/self/cgroup").read().splitlines()
             if line.split(":")[1] in ("cpu", "cpu,cpuacct", ""))
print(f"rank {os.environ['RANK']}: wall/cpu {ratio:.2f} cgroup {group}", flush=True)
