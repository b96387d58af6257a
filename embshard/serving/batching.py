"""Batch the requests that arrive together and run each batch on the collective thread.

The event loop only queues requests and waits on futures: the collectives run one after
another on a daemon thread (`CollectiveThread`), so a slow or stuck rank never blocks the
HTTP server. A batch holds requests of one key (predict, or lookups of one feature) up to
``max_batch_size`` samples (a larger request goes alone); it leaves when full or when its
first request has waited ``max_wait_ms`` (and the previous batch is done). A request not
answered within its timeout fails with `asyncio.TimeoutError` (the server answers 503); a
batch that every rank refuses with ValueError fails its requests with `BatchRefused`; any
other failed exchange marks the group broken (logged once, with the reason: a `GroupBroken`
raised by the exchange says it best), and every later request fails with `GroupBroken`.
When idle, the batcher runs a heartbeat exchange every ``heartbeat_ms``.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from embshard.serving.config import PROG, BatchingConfig
from embshard.serving.metrics import ServingMetrics


class GroupBroken(RuntimeError):
    """The ranks can no longer serve (a collective failed); the message says why."""


class BatchRefused(RuntimeError):
    """Every rank refused the batch (the request parser let through what the predictor rejects)."""


@dataclass(frozen=True)
class BatchKey:
    """What a batch holds: requests with equal keys batch together."""

    kind: str  # "predict" | "lookup" (also the batch kind in /metrics)
    feature: str = ""  # lookup: the feature looked up
    delay_ms: int = 0  # debug: the last rank sleeps this long before its part


@dataclass(eq=False)
class _Job:
    key: BatchKey
    request: Any
    num_samples: int
    arrival: float  # event-loop time
    future: asyncio.Future = field(repr=False)


class CollectiveThread:
    """A daemon thread that runs the calls it is given one after another; results come back as futures."""

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="embshard-collectives", daemon=True).start()

    def call(self, fn: Callable, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def _serve(self) -> None:
        while True:
            loop, future, fn, args = self._calls.get()
            try:
                outcome = (fn(*args), None)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting coroutine
                outcome = (None, e)
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # its request timed out
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class Batcher:
    """``run_batch(key, requests) -> results`` (one per request) and ``heartbeat()``/``stop()`` run on the thread."""

    def __init__(self, run_batch: Callable[[BatchKey, list], Sequence], heartbeat: Callable[[], None],
                 stop: Callable[[], None], config: BatchingConfig, heartbeat_ms: float, metrics: ServingMetrics):
        self._run_batch, self._heartbeat, self._stop = run_batch, heartbeat, stop
        self.config = config
        self.heartbeat_s = heartbeat_ms / 1000
        self.metrics = metrics
        self.broken: str | None = None  # why the ranks cannot serve
        self._thread = CollectiveThread()
        self._queue: deque[_Job] = deque()
        self._arrived = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def submit(self, key: BatchKey, request: Any, num_samples: int, timeout_s: float) -> Any:
        """The request's result; `asyncio.TimeoutError` after ``timeout_s``, `GroupBroken` if the ranks cannot serve."""
        if self.broken is not None:
            raise GroupBroken(self.broken)
        if self._closing:
            raise GroupBroken("the server is shutting down")
        loop = asyncio.get_running_loop()
        job = _Job(key, request, num_samples, loop.time(), loop.create_future())
        self._queue.append(job)
        self._arrived.set()
        return await asyncio.wait_for(job.future, timeout_s)

    def queue_depth(self) -> dict[str, int]:
        waiting = [j for j in self._queue if not j.future.done()]
        return {"requests": len(waiting), "samples": sum(j.num_samples for j in waiting)}

    async def close(self, timeout_s: float) -> None:
        """Finish the batch in flight, fail what still waits, then tell the other ranks to stop."""
        self._closing = True
        self._arrived.set()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout_s)
        for job in self._queue:
            _settle(job.future, None, GroupBroken("the server is shutting down"))
        if self.broken is None:
            await asyncio.wait([asyncio.ensure_future(self._exchange(self._stop))], timeout=timeout_s)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing and self.broken is None:
            self._drop_answered()
            if not self._queue:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), self.heartbeat_s)
                except asyncio.TimeoutError:
                    await self._exchange(self._heartbeat)
                continue
            first = self._queue[0]
            while self._waiting_samples(first.key) < self.config.max_batch_size and not self._closing:
                left_s = first.arrival + self.config.max_wait_ms / 1000 - loop.time()
                if left_s <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left_s)
                except asyncio.TimeoutError:
                    break
            jobs = self._take(first.key)
            if jobs:
                await self._run(first.key, jobs)

    def _drop_answered(self) -> None:
        """Forget requests that timed out while waiting."""
        self._queue = deque(j for j in self._queue if not j.future.done())

    def _waiting_samples(self, key: BatchKey) -> int:
        return sum(j.num_samples for j in self._queue if j.key == key and not j.future.done())

    def _take(self, key: BatchKey) -> list[_Job]:
        """The queue's requests of ``key``, oldest first, up to max_batch_size samples (at least one request)."""
        taken, kept, total = [], deque(), 0
        for job in self._queue:
            fits = not taken or total + job.num_samples <= self.config.max_batch_size
            if job.key == key and not job.future.done() and fits:
                taken.append(job)
                total += job.num_samples
            elif not job.future.done():
                kept.append(job)
        self._queue = kept
        return taken

    async def _run(self, key: BatchKey, jobs: list[_Job]) -> None:
        self.metrics.record_batch(key.kind, sum(j.num_samples for j in jobs))
        try:
            results, error = await self._thread.call(self._run_batch, key, [j.request for j in jobs]), None
        except ValueError as e:  # every rank refused the batch together (Predictor's checks): still in step
            results, error = None, BatchRefused(str(e))
        except Exception as e:  # noqa: BLE001 - anything else mid-exchange leaves the ranks out of step
            results, error = None, GroupBroken(self._mark_broken(e))
        for i, job in enumerate(jobs):
            _settle(job.future, None if results is None else results[i], error)

    async def _exchange(self, fn: Callable) -> None:
        """``fn()`` (heartbeat, stop) on the collective thread; a failure marks the group broken."""
        try:
            await self._thread.call(fn)
        except Exception as e:  # noqa: BLE001
            self._mark_broken(e)

    def _mark_broken(self, e: Exception) -> str:
        if isinstance(e, GroupBroken):
            self.broken = str(e)
        else:
            first_line = (str(e).splitlines() or [type(e).__name__])[0][:300]
            self.broken = f"a collective failed, the ranks are out of step ({type(e).__name__}: {first_line})"
        print(f"{PROG}: error: {self.broken}; /healthz and every request answer 503 until the server is restarted",
              file=sys.stderr, flush=True)
        return self.broken
