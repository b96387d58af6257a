"""torchrun with one line for a job that cannot start: ``python -m embshard.launch.torchrun`` takes torchrun's arguments.

    python -m embshard.launch.torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr HOST0 \\
        --master-port 29500 --rdzv-conf timeout=60 -m embshard.train ...

It runs torchrun's own launcher (torch.distributed.run). Where torchrun ends with a traceback
(a host that never joins the rendezvous, a master address that does not answer) or with its
failure table (a rank exited badly: the rank printed why), it prints one line
``embshard-torchrun: error: ...`` naming the cause and exits 2 (rendezvous) or with the rank's
status. ``--rdzv-conf timeout=S`` bounds both waits (torchrun's default: 600 s).
torchrun's C++ connection retries are not logged (TORCH_CPP_LOG_LEVEL, the ranks keep theirs).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Sequence

PROG = "embshard-torchrun"


def _quiet_import():
    """torch.distributed.run, imported with c10d's C++ log at FATAL for this process only."""
    before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch.distributed.run as torchrun
    finally:
        if before is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = before
    return torchrun


def explain(error: BaseException, args) -> str | None:
    """One line for a rendezvous that failed (None: not a rendezvous failure)."""
    import torch.distributed as dist

    where = f"{args.master_addr}:{args.master_port}"
    text = str(error)
    joined = re.search(r"(\d+)/(\d+) clients joined", text)
    if isinstance(error, dist.DistStoreError) and joined:
        have, want = map(int, joined.groups())
        return (f"only {have} of {want} hosts joined the rendezvous at {where} within the timeout; start this command on "
                f"every host (--node-rank 0..{want - 1}, the same --master-addr and --master-port) or raise --rdzv-conf "
                "timeout=SECONDS")
    if isinstance(error, (dist.DistNetworkError, dist.DistStoreError)) and "trying to connect" in text:
        return (f"the master address {where} did not answer within the timeout (node rank {args.node_rank}): check "
                f"--master-addr/--master-port (host 0's address, reachable from this host) and that torchrun runs on host 0")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    torchrun = _quiet_import()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = f"was killed by signal {-failure.exitcode}" if failure.exitcode < 0 else f"exited with status {failure.exitcode}"
        print(f"{PROG}: error: rank {rank} {how} (its output above says why); the other ranks of this host were stopped",
              file=sys.stderr, flush=True)
        return failure.exitcode if failure.exitcode > 0 else 1
    except Exception as e:  # the rendezvous fails with several torch error types
        line = explain(e, args)
        if line is None:
            raise
        print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
