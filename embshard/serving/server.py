"""Rank 0's HTTP front end (aiohttp): /predict, /lookup, /healthz, /metrics.

Handlers read the body (408 past ``read_timeout_ms``), parse and check it (4xx naming the
field; a large body on a worker thread), queue it in the `Batcher` and wait for its slice of
the batch's result; they never touch a collective. Errors are JSON ``{"error": "..."}``:
400/413 for bad requests, 503 for a request that timed out in the ranks or a broken group
(then /healthz is 503 too, with the reason), 500 for a bug; /metrics counts every status.
Headers must arrive within ``read_timeout_ms`` of the connection opening (or of the last
answer), else the connection is closed. `serve` runs until SIGTERM/SIGINT (more signals
while stopping change nothing), then stops listening, finishes the requests in flight,
stops the ranks and removes the port file.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import traceback
from pathlib import Path

from aiohttp import web

from embshard.fsutil import write_text_atomic
from embshard.serving.batching import BatchKey, Batcher, BatchRefused, GroupBroken
from embshard.serving.config import ServerConfig, num_ranks
from embshard.serving.metrics import ServingMetrics
from embshard.serving.predictor import ServingSchema
from embshard.serving.requests import RequestError, parse_lookup, parse_off_loop, parse_predict

DEBUG_DELAY_HEADER = "X-Embshard-Debug-Delay-Ms"
ENDPOINTS = ("/predict", "/lookup", "/healthz", "/metrics")


def build_app(schema: ServingSchema, batcher: Batcher, metrics: ServingMetrics, config: ServerConfig) -> web.Application:
    timeout_s = config.request_timeout_ms / 1000

    async def answer(request: web.Request, parse, key_of, to_json) -> web.Response:
        try:
            raw = await asyncio.wait_for(request.read(), config.read_timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise RequestError(f"body: not received within server.read_timeout_ms={config.read_timeout_ms:g}; send the "
                               "whole body at once", status=408) from None
        parsed = await parse_off_loop(parse, raw, schema, config)
        key = key_of(parsed, _debug_delay_ms(request, config))
        try:
            result = await batcher.submit(key, parsed, parsed.num_samples, timeout_s)
        except asyncio.TimeoutError:
            return _error(503, f"the ranks did not answer within request_timeout_ms={config.request_timeout_ms:g}; "
                               "retry, or see /healthz")
        except GroupBroken as e:
            return _error(503, str(e))
        except BatchRefused as e:
            return _error(500, f"the ranks refused the batch: {e}")
        return web.json_response(to_json(result))

    async def predict(request: web.Request) -> web.Response:
        return await answer(request, parse_predict, lambda r, d: BatchKey("predict", delay_ms=d),
                            lambda scores: {"scores": scores.tolist()})

    async def lookup(request: web.Request) -> web.Response:
        return await answer(request, parse_lookup, lambda r, d: BatchKey("lookup", r.feature, d),
                            lambda rows: {"embeddings": rows.tolist()})

    async def healthz(request: web.Request) -> web.Response:
        if batcher.broken is not None:
            return web.json_response({"status": "unhealthy", "reason": batcher.broken}, status=503)
        return web.json_response({"status": "ok", "world_size": schema.world_size})

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.json_response(metrics.snapshot())

    @web.middleware
    async def measure(request: web.Request, handler) -> web.StreamResponse:
        start = time.perf_counter()
        try:
            response = await handler(request)
        except RequestError as e:
            response = _error(e.status, str(e))
        except web.HTTPException as e:  # aiohttp's own (404, 405, 413 body too large)
            response = _error(e.status, e.reason if e.status != 413 else
                              f"body: larger than server.max_body_bytes={config.max_body_bytes}; split the request")
        except Exception as e:  # noqa: BLE001 - a bug: answered (and counted) as JSON, logged with its traceback
            traceback.print_exc(file=sys.stderr)
            response = _error(500, f"internal error ({type(e).__name__}); see the server's log")
        if response.status == 408:
            response.force_close()  # the rest of the body is not awaited on this connection
        endpoint = request.path if request.path in ENDPOINTS else "other"
        metrics.record_request(endpoint, response.status, (time.perf_counter() - start) * 1000)
        return response

    app = web.Application(middlewares=[measure], client_max_size=config.max_body_bytes)
    app.add_routes([web.post("/predict", predict), web.post("/lookup", lookup), web.get("/healthz", healthz),
                    web.get("/metrics", metrics_handler)])
    return app


def _debug_delay_ms(request: web.Request, config: ServerConfig) -> int:
    raw = request.headers.get(DEBUG_DELAY_HEADER)
    if raw is None:
        return 0
    if not config.debug_delay:
        raise RequestError(f"{DEBUG_DELAY_HEADER}: header accepted only when the server runs with "
                           "server.debug_delay=true")
    if not raw.isdigit():
        raise RequestError(f"{DEBUG_DELAY_HEADER}: expected a whole number of milliseconds, got {raw[:20]!r}")
    return int(raw)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def start_site(app: web.Application, config: ServerConfig) -> tuple[web.AppRunner, int]:
    """Listen on ``config.host``/``port``; the runner and the port. ValueError if the port is taken."""
    read_timeout_s = config.read_timeout_ms / 1000
    # keepalive_timeout also runs from the connection's start, so it bounds the wait for headers;
    # lingering_time bounds the wait for the rest of a body that was refused (408, 413)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=config.shutdown_timeout_s,
                           keepalive_timeout=read_timeout_s, lingering_time=read_timeout_s)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port).start()
    except OSError as e:
        await runner.cleanup()
        raise ValueError(f"server.host/port: cannot listen on {config.host}:{config.port} ({e.strerror}); choose "
                         "another port (server.port=0 picks a free one)") from None
    return runner, runner.addresses[0][1]


async def serve(app: web.Application, batcher: Batcher, config: ServerConfig, world_size: int) -> None:
    """Listen until SIGTERM/SIGINT, then stop: no new connections, requests in flight finish, ranks stop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum, frame) -> None:
        try:
            loop.call_soon_threadsafe(stop.set)
        except RuntimeError:  # the loop is closed: the server has stopped already
            pass
    # plain handlers, not the loop's: they stay after the loop closes, so a later signal cannot kill a stopping rank
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    batcher.start()
    try:
        runner, port = await start_site(app, config)
    except ValueError:
        await batcher.close(config.shutdown_timeout_s)
        raise
    print(f"embshard-serve: listening on http://{config.host}:{port} ({num_ranks(world_size)})", flush=True)
    port_file = Path(config.port_file) if config.port_file else None
    if port_file is not None:
        write_text_atomic(port_file, f"{port}\n")
    try:
        await stop.wait()
        print("embshard-serve: stopping", file=sys.stderr, flush=True)
        await runner.cleanup()
        await batcher.close(config.shutdown_timeout_s)
    finally:
        if port_file is not None:
            port_file.unlink(missing_ok=True)
