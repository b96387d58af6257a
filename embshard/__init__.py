"""embshard: embedding sharding engine for recommendation models (planner, runtime, training, serving).

Imported before torch (as embshard's commands and ranks are), it asks torch to back its large CPU tensors (2 MiB
and up) with transparent huge pages (THP_MEM_ALLOC_ENABLE, which torch reads once, at its first allocation):
a buffer allocated every step then faults in one page per 2 MiB, not 512. The dense gradient of a data-parallel
table in the allreduce mode is one: 8 such tables of 1M rows x 64 in all took 492 ms a step on 2 ranks of the
2-core Intel VM of benchmarks/results without, 375 ms with (glibc malloc keeping freed memory in both). THP_MEM_ALLOC_ENABLE=0 keeps torch's default;
the kernel's THP setting (/sys/kernel/mm/transparent_hugepage/enabled: never) can forbid it.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

if "torch" not in _sys.modules:
    _os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
