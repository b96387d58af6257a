"""Seeded synthetic Criteo-like samples with a planted, learnable signal.

    source = SyntheticSource(SyntheticConfig(seed=0), layout, split="train")
    samples = source.read(start=0, count=512)   # the same samples for the same arguments

Samples are generated in chunks of CHUNK samples, each from its own generator seeded by
(seed, split, chunk), so any slice of the endless stream is the same whoever reads it.
- dense: 13 Criteo-like counts, exp(1 + 1.2 z) with z ~ N(0, 1), given to the model as log1p.
- ids: per feature, ranks drawn from a Zipf law with exponent ``id_skew`` over the table's
  rows (0 = uniform), scattered over the rows by a multiplicative hash (hot rows are not
  all at the front). Bags hold one id when the pooling factor is 1, else Poisson(pf) ids.
- labels: Bernoulli(sigmoid(logit)) with logit = bias + signal * normalised sum of a
  hidden weight per (feature, row) (mean over the bag), of the dense z, and, with sequence
  features, of the agreement of the history's and the target's hidden item vectors.
  A model learns the weights of frequent rows, so AUC rises well above 0.5 with training.
"""

from __future__ import annotations

import math

import numpy as np

from embshard.data.samples import Feature, FeatureLayout, Samples
from embshard.data.config import SyntheticConfig
from embshard.data.malformed import MalformedLog

CHUNK = 128
SPLITS = {"train": 0, "eval": 1}
ITEM_LATENT_DIM = 4
SEQUENCE_WEIGHT = 3.0  # the history-target agreement has the variance of this many features' terms
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-mixed uint64 hash of each element."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def hidden_uniform(key: int, ids: np.ndarray) -> np.ndarray:
    """A fixed value in [-sqrt(3), sqrt(3)) (unit variance) per (key, id)."""
    h = mix64(ids.astype(np.uint64) * _GOLDEN + mix64(np.array([key], np.uint64)))
    return ((h >> np.uint64(11)).astype(np.float64) / 2.0**53 - 0.5) * math.sqrt(12.0)


def zipf_rows(rng: np.random.Generator, num_rows: int, skew: float, n: int, salt: int) -> np.ndarray:
    u = rng.random(n)
    if skew == 0:
        ranks = np.floor(u * num_rows)
    elif skew == 1:
        ranks = np.floor(np.exp(u * math.log(num_rows + 1))) - 1
    else:
        top = (num_rows + 1) ** (1 - skew)
        ranks = np.floor((1 + u * (top - 1)) ** (1 / (1 - skew))) - 1
    ranks = np.clip(ranks, 0, num_rows - 1).astype(np.uint64)
    return scatter_ranks(ranks, num_rows, salt)


def scatter_ranks(ranks: np.ndarray, num_rows: int, salt: int) -> np.ndarray:
    """Popularity rank -> row id, one-to-one over [0, num_rows): ``(rank * a + salt) mod num_rows``
    with a multiplier ``a`` coprime to ``num_rows``, so hot rows are spread over the table (and its
    row shards) and every row can be drawn. Exact in uint64 below 2**32 rows, in Python ints above."""
    a = int(_GOLDEN) % num_rows or 1
    while math.gcd(a, num_rows) != 1:
        a += 1
    if num_rows <= 2**32:  # rank * a < 2**64
        return ((ranks * np.uint64(a) + np.uint64(salt % num_rows)) % np.uint64(num_rows)).astype(np.int64)
    return np.array([(int(r) * a + salt) % num_rows for r in ranks.tolist()], dtype=np.int64)


def bag_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sum of ``values`` within each bag (0 for an empty bag)."""
    return np.bincount(np.repeat(np.arange(len(lengths)), lengths), weights=values, minlength=len(lengths))


class SyntheticSource:
    num_samples = None  # endless

    def __init__(self, config: SyntheticConfig, layout: FeatureLayout, split: str = "train") -> None:
        self.config, self.layout, self.split = config, layout, SPLITS[split]
        self.malformed = MalformedLog()
        rng = np.random.Generator(np.random.PCG64([config.seed, 99]))
        self.dense_weights = rng.normal(size=layout.num_dense) / math.sqrt(layout.num_dense)
        num_terms = len(layout.pooled) + 1 + (SEQUENCE_WEIGHT if layout.sequence else 0)
        self.scale = config.signal / math.sqrt(num_terms)
        # E[sigmoid(b + s Z)] ~ sigmoid(b / sqrt(1 + pi s^2 / 8)) for Z ~ N(0, 1): aim at positive_rate.
        rate_logit = math.log(config.positive_rate / (1 - config.positive_rate))
        self.bias = rate_logit * math.sqrt(1 + math.pi * config.signal**2 / 8)

    def read(self, start: int, count: int) -> Samples:
        first, last = start // CHUNK, (start + count - 1) // CHUNK
        chunks = Samples.concat([self._chunk(c) for c in range(first, last + 1)])
        return chunks.slice(start - first * CHUNK, start - first * CHUNK + count)

    def _chunk(self, index: int) -> Samples:
        rng = np.random.Generator(np.random.PCG64([self.config.seed, self.split, index]))
        z = rng.normal(size=(CHUNK, self.layout.num_dense))
        dense = np.log1p(np.floor(np.exp(1.0 + 1.2 * z))).astype(np.float32)
        logit = z @ self.dense_weights
        lengths, values = [], []
        for i, f in enumerate(self.layout.pooled):
            n, ids = self._bag(rng, f, i)
            lengths.append(n)
            values.append(ids)
            logit += bag_sums(hidden_uniform(i, ids), n) / np.maximum(n, 1)
        if self.layout.sequence:
            n, ids, agreement = self._sequence(rng, self.layout.sequence[0])
            lengths += n
            values += ids
            logit += math.sqrt(SEQUENCE_WEIGHT) * agreement
        logit = self.bias + self.scale * logit
        labels = (rng.random(CHUNK) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        return Samples(dense, labels, np.stack(lengths).astype(np.int64), tuple(values))

    def _bag(self, rng: np.random.Generator, f: Feature, salt: int) -> tuple[np.ndarray, np.ndarray]:
        n = np.ones(CHUNK, np.int64) if f.pooling_factor == 1 else rng.poisson(f.pooling_factor, CHUNK).astype(np.int64)
        return n, zipf_rows(rng, f.num_embeddings, self.config.id_skew, int(n.sum()), salt)

    def _sequence(self, rng: np.random.Generator, history: Feature) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """History (1..L items) and target (1 item) of one table, and their hidden agreement (unit scale)."""
        n_hist = rng.integers(1, self.layout.max_history_length + 1, CHUNK).astype(np.int64)
        salt = 10_000
        hist = zipf_rows(rng, history.num_embeddings, self.config.id_skew, int(n_hist.sum()), salt)
        target = zipf_rows(rng, history.num_embeddings, self.config.id_skew, CHUNK, salt)
        latent_hist = np.stack([hidden_uniform(salt + k, hist) for k in range(ITEM_LATENT_DIM)], 1)
        latent_target = np.stack([hidden_uniform(salt + k, target) for k in range(ITEM_LATENT_DIM)], 1)
        mean_hist = np.stack([bag_sums(latent_hist[:, k], n_hist) for k in range(ITEM_LATENT_DIM)], 1) / n_hist[:, None]
        agreement = (mean_hist * latent_target).sum(1) * np.sqrt(n_hist / ITEM_LATENT_DIM)
        return [n_hist, np.ones(CHUNK, np.int64)], [hist, target], agreement
