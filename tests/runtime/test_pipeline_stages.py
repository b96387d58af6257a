"""InputPipeline (runtime/pipeline.py) stages the input dist of collections that ship something, and leaves a
collection whose look-ups are all local to its own forward (its side thread would only run the header)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from embshard.runtime.pipeline import InputPipeline


class FakeCollection:
    def __init__(self, all_local: bool) -> None:
        self.all_local, self.distributed, self.staged = all_local, [], []

    def distribute(self, features, pg):
        self.distributed.append((features, pg))
        return f"dist of {features}"

    def stage(self, features, distributed) -> None:
        self.staged.append((features, distributed))


def test_only_collections_that_ship_ids_are_distributed_on_the_side_thread() -> None:
    local, sharded = FakeCollection(all_local=True), FakeCollection(all_local=False)
    batches = iter(["b0", "b1"])
    pipeline = InputPipeline.__new__(InputPipeline)  # without a process group: the fakes issue no collective
    pipeline.pg, pipeline.read, pipeline.pending = "side group", lambda: next(batches), None
    pipeline.inputs = lambda b: [(local, f"{b}.local"), (sharded, f"{b}.sharded")]
    pipeline.pool = ThreadPoolExecutor(1, thread_name_prefix="embshard-input-dist")
    try:
        assert pipeline.next() == "b0"
        pipeline.prefetch()
        assert pipeline.next() == "b1"
    finally:
        pipeline.pool.shutdown(wait=True)
    assert local.distributed == [] and local.staged == []
    assert sharded.distributed == [("b0.sharded", "side group"), ("b1.sharded", "side group")]
    assert sharded.staged == [("b0.sharded", "dist of b0.sharded"), ("b1.sharded", "dist of b1.sharded")]
