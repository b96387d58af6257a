"""Parse and check the JSON bodies of /predict and /lookup against the served model's schema.

Everything a rank would refuse is refused here, before the batch reaches the collectives:
a `RequestError` carries the HTTP status and a message that names the field (``samples[3].
sparse.cat_2[5]``) and how to fix it. Parsed requests are frozen values holding tensors;
`merge_predicts` stacks the requests of one batch.

/predict body: ``{"samples": [{"dense": [F floats], "sparse": {"cat_0": [ids], ...}}, ...]}``
(every schema feature in every sample; ``[]`` is an empty bag; a model with a user history
takes exactly one ``target`` id per sample); /lookup body:
``{"feature": "cat_3", "ids": [ids]}``. Limits (`ServerConfig`): samples per request, ids per
bag and per request (413, checked before the ids are), nesting depth (400, not a RecursionError).

Parsing a large body takes long: `parse_off_loop` runs it on a worker thread, and its JSON
decoder calls back into Python at every value, so the GIL (and with it the event loop) is
handed over while it works, even inside one long list.
"""

from __future__ import annotations

import array
import asyncio
import json
import math
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from embshard.models.config import TARGET_FEATURE
from embshard.serving.config import ServerConfig
from embshard.serving.predictor import ServingSchema

INLINE_PARSE_BYTES = 64 << 10  # smaller bodies parse on the event loop (well under a millisecond)
T = TypeVar("T")


class RequestError(ValueError):
    """A request the server refuses: ``status`` is the HTTP status (4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PredictRequest:
    dense_BF: torch.Tensor  # float32 [B, num_dense]
    lengths_BF: torch.Tensor  # int64 [B, num_features]: ids per sample and feature (schema order)
    ids_by_feature: tuple[torch.Tensor, ...]  # per feature (schema order): int64 ids of all samples, sample after sample

    @property
    def num_samples(self) -> int:
        return self.dense_BF.shape[0]


@dataclass(frozen=True)
class LookupRequest:
    feature: str
    ids_N: torch.Tensor  # int64 [N]

    @property
    def num_samples(self) -> int:
        return self.ids_N.shape[0]


def parse_body(raw: bytes, yielding: bool = False) -> dict:
    """The JSON object of ``raw``; ``yielding``: let other threads run between values (slower, for big bodies)."""
    try:
        body = json.loads(raw, **(_YIELDING_HOOKS if yielding else {}))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"body: not valid JSON ({e}); send a JSON object") from None
    except RecursionError:
        raise RequestError("body: JSON nested too deeply; a /predict body is {\"samples\": [{\"dense\": [...], "
                           "\"sparse\": {...}}, ...]}, a /lookup body {\"feature\": ..., \"ids\": [...]}") from None
    if not isinstance(body, dict):
        raise RequestError(f"body: expected a JSON object, got {_type_name(body)}")
    return body


async def parse_off_loop(parse: Callable[..., T], raw: bytes, *args) -> T:
    """``parse(raw, *args, yielding=...)``: inline for a small body, on a worker thread for a large one."""
    if len(raw) <= INLINE_PARSE_BYTES:
        return parse(raw, *args)
    return await asyncio.to_thread(parse, raw, *args, yielding=True)


def _same(value):
    return value


def _int(text: str) -> int:
    return int(text)


def _float(text: str) -> float:
    return float(text)


# Python callbacks at every object and number: the C decoder passes through the interpreter, which hands the GIL over
_YIELDING_HOOKS = {"object_hook": _same, "parse_int": _int, "parse_float": _float}


def parse_predict(raw: bytes, schema: ServingSchema, config: ServerConfig, yielding: bool = False) -> PredictRequest:
    body = parse_body(raw, yielding)
    unknown = sorted(set(body) - {"samples"})
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field; the body is {{\"samples\": [...]}}")
    samples = _field(body, "samples", list)
    if not samples:
        raise RequestError("samples: empty; send at least one sample")
    if len(samples) > config.max_request_samples:
        raise RequestError(f"samples: {len(samples)} samples, more than server.max_request_samples="
                           f"{config.max_request_samples}; split the request", status=413)
    features = list(schema.sparse_features)
    dense, lengths = [], []
    num_ids = 0
    ids: list[list[int]] = [[] for _ in features]
    for i, sample in enumerate(samples):
        where = f"samples[{i}]"
        if not isinstance(sample, dict):
            raise RequestError(f"{where}: expected an object with 'dense' and 'sparse', got {_type_name(sample)}")
        unknown = sorted(set(sample) - {"dense", "sparse"})
        if unknown:
            raise RequestError(f"{where}.{unknown[0]}: unknown field; a sample has 'dense' and 'sparse'")
        values = _field(sample, "dense", list, f"{where}.")
        if len(values) != schema.num_dense:
            raise RequestError(f"{where}.dense: {len(values)} values, the model takes {schema.num_dense}")
        dense.append([_number(v, f"{where}.dense[{j}]") for j, v in enumerate(values)])
        sparse = _field(sample, "sparse", dict, f"{where}.")
        unknown = sorted(set(sparse) - set(features))
        if unknown:
            raise RequestError(f"{where}.sparse.{unknown[0]}: unknown feature; the model's features are "
                               f"{', '.join(features)}")
        row = []
        for f, name in enumerate(features):
            if name not in sparse:
                raise RequestError(f"{where}.sparse.{name}: missing; every sample needs every feature ([] for none)")
            bag, bag_where = sparse[name], f"{where}.sparse.{name}"
            if isinstance(bag, list):  # counted before its ids are checked: the work stays within the limits
                num_ids += len(bag)
                _check_ids_count(len(bag), num_ids, bag_where, config)
            feature_ids = _ids(bag, bag_where, schema.sparse_features[name])
            if name == TARGET_FEATURE and name in schema.sequence_features and len(feature_ids) != 1:
                raise RequestError(f"{where}.sparse.{name}: {len(feature_ids)} ids; the target item takes exactly one")
            ids[f].extend(feature_ids)
            row.append(len(feature_ids))
        lengths.append(row)
    return PredictRequest(dense_BF=torch.tensor(dense, dtype=torch.float32),
                          lengths_BF=torch.tensor(lengths, dtype=torch.int64).reshape(len(samples), len(features)),
                          ids_by_feature=tuple(_int64(x) for x in ids))


def parse_lookup(raw: bytes, schema: ServingSchema, config: ServerConfig, yielding: bool = False) -> LookupRequest:
    body = parse_body(raw, yielding)
    unknown = sorted(set(body) - {"feature", "ids"})
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field; a lookup has 'feature' and 'ids'")
    feature = _field(body, "feature", str)
    if feature not in schema.sparse_features:
        raise RequestError(f"feature: unknown feature {feature!r}; the model's features are "
                           f"{', '.join(schema.sparse_features)}")
    ids = _field(body, "ids", list)
    if not ids:
        raise RequestError("ids: empty; send at least one id")
    if len(ids) > config.max_request_samples:
        raise RequestError(f"ids: {len(ids)} ids, more than server.max_request_samples={config.max_request_samples}; "
                           "split the request", status=413)
    _ids(ids, "ids", schema.sparse_features[feature])
    return LookupRequest(feature=feature, ids_N=_int64(ids))


def merge_predicts(requests: list[PredictRequest]) -> PredictRequest:
    """One request holding the samples of ``requests``, in order."""
    return PredictRequest(
        dense_BF=torch.cat([r.dense_BF for r in requests]),
        lengths_BF=torch.cat([r.lengths_BF for r in requests]),
        ids_by_feature=tuple(torch.cat(per_feature) for per_feature in zip(*(r.ids_by_feature for r in requests))))


def _check_ids_count(bag_ids: int, request_ids: int, where: str, config: ServerConfig) -> None:
    if bag_ids > config.max_bag_ids:
        raise RequestError(f"{where}: {bag_ids} ids in one bag, more than server.max_bag_ids={config.max_bag_ids}; "
                           "send fewer ids, or raise server.max_bag_ids", status=413)
    if request_ids > config.max_request_ids:
        raise RequestError(f"{where}: the request holds more than server.max_request_ids={config.max_request_ids} ids "
                           "by here; split the request, or raise server.max_request_ids", status=413)


def _field(obj: dict, key: str, kind: type, prefix: str = ""):
    """``obj[key]``, checked to be a ``kind``; errors name it ``prefix + key``."""
    if key not in obj:
        raise RequestError(f"{prefix}{key}: missing")
    value = obj[key]
    if not isinstance(value, kind):
        raise RequestError(f"{prefix}{key}: expected {_KIND_NAMES[kind]}, got {_type_name(value)}")
    return value


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{where}: expected a finite number, got {json.dumps(value)[:40]}")
    return float(value)


def _ids(values, where: str, num_embeddings: int) -> list[int]:
    if not isinstance(values, list):
        raise RequestError(f"{where}: expected a list of ids, got {_type_name(values)}")
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise RequestError(f"{where}[{j}]: expected an integer id, got {json.dumps(v)[:40]}")
        if not 0 <= v < num_embeddings:
            raise RequestError(f"{where}[{j}]: id {v} out of range; valid ids are 0..{num_embeddings - 1}")
    return values


def _int64(ids: list[int]) -> torch.Tensor:
    """int64 [N] of checked ids, through an array (3x faster than torch.tensor, which holds the GIL throughout)."""
    return torch.frombuffer(array.array("q", ids), dtype=torch.int64) if ids else torch.empty(0, dtype=torch.int64)


_KIND_NAMES = {list: "a list", dict: "an object", str: "a string"}


def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
