"""The run's metrics: one JSON object per line (metrics.jsonl), optionally TensorBoard
scalars, and a PNG of the loss and eval AUC curves at the end. Rank 0 writes them.

Records: ``{"split": "train", "step", "loss", "samples_per_s", "samples"}`` every
``log_every_steps`` steps and ``{"split": "eval", "step", "auc", "logloss", "samples"}`` per evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    def __init__(self, out_dir: Path, tensorboard: bool) -> None:
        self.path = out_dir / "metrics.jsonl"
        self.records: list[dict[str, Any]] = []
        self.file = self.path.open("a")
        self.writer = None
        if tensorboard:  # the settings checked that the package is installed
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(out_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.writer is not None:
            for key, value in record.items():
                if key not in ("split", "step"):
                    self.writer.add_scalar(f"{record['split']}/{key}", value, record["step"])

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()


def save_curves(records: list[dict[str, Any]], path: Path) -> None:
    """Training loss and eval AUC / log loss against the step, side by side."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, auc_ax = fig.subplots(1, 2)
    loss_ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    loss_ax.plot([r["step"] for r in evals], [r["logloss"] for r in evals], "o-", label="eval log loss")
    loss_ax.set(xlabel="step", ylabel="binary cross-entropy", title="Loss")
    loss_ax.legend()
    loss_ax.grid(alpha=0.3)
    auc_ax.plot([r["step"] for r in evals], [r["auc"] for r in evals], "o-", color="tab:green")
    auc_ax.set(xlabel="step", ylabel="AUC", title="Eval AUC")
    auc_ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
