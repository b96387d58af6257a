"""What every multi-rank app shares (`embshard-train`, `embshard-serve`, `embshard-calibrate`):
the local launcher (`launcher`), a rank's process group and the helpers on which ranks agree
(`distributed`), the one error line per job (`report`), naming lost ranks and hosts (`lost_ranks`)
and the command line a Hydra app passes to its ranks (`child`)."""
