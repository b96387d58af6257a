"""Fixtures of the training tests: a config folder (``--config-dir``) with small table sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from train_tables import FEWER, LARGER, TINY, criteo_like


@pytest.fixture(scope="session")
def config_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("configs")
    (root / "tables").mkdir()
    for name, text in (("tiny", TINY), ("larger", LARGER), ("fewer", FEWER), ("criteo26", criteo_like())):
        (root / "tables" / f"{name}.yaml").write_text(text)
    return root
