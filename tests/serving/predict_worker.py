"""One serving rank of the tests: load each artifact with `Predictor.load`, predict this rank's
slice of the samples, look every feature's rows up, and save what came back.

    python tests/serving/predict_worker.py --rank R --world-size W --port P --inputs samples.safetensors \
        --out DIR ARTIFACT [ARTIFACT ...]

Rank r predicts samples [cuts[r], cuts[r+1]), then rank 0 alone the first SMALL_BATCH (the
others an empty slice); it looks up rows
r, r+W, r+2W, ... of every feature's table. Per artifact it writes ``rank{r}_{i}.safetensors``
(scores, rows.FEATURE) and ``rank{r}_{i}.json`` (memory_bytes, or the error it raised).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.serving.predictor import ArtifactError, Predictor


SMALL_BATCH = 5


def rank_cuts(num_samples: int, world_size: int) -> list[int]:
    """Uneven slices: rank 0 takes 60% of the samples, the other ranks share the rest."""
    first = int(num_samples * 0.6) if world_size > 1 else num_samples
    return [0, *np.linspace(first, num_samples, world_size).astype(int).tolist()]


def sample_slice(inputs: dict[str, torch.Tensor], features: list[str], start: int, stop: int):
    """dense [n, F] and a KeyedJaggedTensor of samples [start, stop) with ``features`` in order."""
    lengths, values = [], []
    for f in features:
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), inputs[f"lengths.{f}"].cumsum(0)])
        lengths.append(inputs[f"lengths.{f}"][start:stop])
        values.append(inputs[f"values.{f}"][offsets[start]:offsets[stop]])
    kjt = KeyedJaggedTensor(keys=features, values=torch.cat(values), lengths=torch.cat(lengths), stride=stop - start)
    return inputs["dense"][start:stop], kjt


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--rank", "--world-size", "--port"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("artifacts", type=Path, nargs="+")
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world_size, timeout=timedelta(seconds=60))
    pg, r, W = dist.group.WORLD, args.rank, args.world_size
    inputs = load_file(args.inputs)
    num_samples = inputs["dense"].shape[0]
    cuts = rank_cuts(num_samples, W)
    for i, artifact in enumerate(args.artifacts):
        stem = args.out / f"rank{r}_{i}"
        try:
            predictor = Predictor.load(artifact, pg)
        except ArtifactError as e:
            stem.with_suffix(".json").write_text(json.dumps({"error": str(e)}))
            continue
        features = list(predictor.schema.sparse_features)
        dense, kjt = sample_slice(inputs, features, cuts[r], cuts[r + 1])
        out = {"scores": predictor.predict(dense, kjt)}
        small = SMALL_BATCH if r == 0 else 0  # every other rank predicts an empty slice
        out["scores_small"] = predictor.predict(*sample_slice(inputs, features, 0, small))
        for f, rows in predictor.schema.sparse_features.items():
            out[f"rows.{f}"] = predictor.lookup(f, torch.arange(r, rows, W))
        out["empty_lookup"] = predictor.lookup(features[0], torch.arange(0, 3 if r == 0 else 0))
        save_file({k: v.contiguous() for k, v in out.items()}, stem.with_suffix(".safetensors"))
        stem.with_suffix(".json").write_text(json.dumps({"memory_bytes": dict(predictor.memory_bytes()),
                                                         "schema_features": features}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # skip the interpreter's teardown: a gloo worker thread still holding a finished work's tensors can abort
    # it ("terminate called without an active exception", SIGABRT) after the rank has done and said all
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
