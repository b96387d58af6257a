"""python -m embshard.train ... (what torchrun runs: torchrun --nproc-per-node 2 -m embshard.train)."""

from embshard.train.main import main

main()
