"""Client side of embshard-serve's HTTP API: request bodies from samples, and a JSON POST.

    body = predict_body(samples, layout)          # {"samples": [{"dense": [...], "sparse": {...}}, ...]}
    status, answer = await post_json(session, f"{url}/predict", body)

Used by the tests and benchmarks/serve_load.py.
"""

from __future__ import annotations

from typing import Any, Mapping

import aiohttp
import numpy as np

from embshard.data.batch import FeatureLayout, Samples


def predict_body(samples: Samples, layout: FeatureLayout) -> dict:
    """The /predict body of ``samples`` (dense floats as stored, every feature's ids)."""
    offsets = np.concatenate([np.zeros((len(samples.values), 1), np.int64), np.cumsum(samples.lengths, axis=1)], axis=1)
    dense = samples.dense.tolist()
    return {"samples": [
        {"dense": dense[i],
         "sparse": {f.name: samples.values[k][offsets[k, i]:offsets[k, i + 1]].tolist()
                    for k, f in enumerate(layout.features)}}
        for i in range(len(samples))]}


async def post_json(session: aiohttp.ClientSession, url: str, body: Any,
                    headers: Mapping[str, str] | None = None) -> tuple[int, dict]:
    """POST ``body`` as JSON (or raw bytes/str as given); the status and the JSON answer."""
    kwargs = {"data": body} if isinstance(body, (bytes, str)) else {"json": body}
    async with session.post(url, headers=headers, **kwargs) as response:
        return response.status, await response.json()


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with session.get(url) as response:
        return response.status, await response.json()
