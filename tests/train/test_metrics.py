"""Metrics: one JSON record per line, TensorBoard scalars, and the curves PNG."""

from __future__ import annotations

import json

import pytest

from embshard.train.metrics import MetricsLog, save_curves


def test_jsonl_tensorboard_and_curves(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    log = MetricsLog(tmp_path, tensorboard=True)
    for step in range(1, 4):
        log.write({"split": "train", "step": step, "loss": 1.0 / step, "samples_per_s": 100.0, "samples": 10 * step})
    log.write({"split": "eval", "step": 3, "auc": 0.7, "logloss": 0.5})
    log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == log.records and [r["split"] for r in records] == ["train"] * 3 + ["eval"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    save_curves(log.records, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
