"""`tables_file=PATH` for embshard-train: the file becomes the tables option, merged like a shipped one.

embshard-plan's end-to-end runs with tables_file are in tests/test_plan_cli.py.
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from embshard.cli import CONFIG_DIR
from embshard.planner.types import ShardingType
from embshard.tables_option import with_tables_file
from embshard.train import config

PLAIN = """tables:
  - {name: a, num_embeddings: 1000, embedding_dim: 16}
  - {name: b, num_embeddings: 5000, embedding_dim: 16, pooling_factor: 3.0}
topology: {hbm_gib: 1, device: cpu}
constraints:
  tables: {b: {sharding_types: [row_wise]}}
"""


def test_train_composes_a_plain_file_under_command_line_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(PLAIN)
    argv = with_tables_file(["embshard-train", f"tables_file={path}", "topology.hbm_gib=2", "launcher.nproc=2"])
    assert argv == ["embshard-train", f"tables_file={path}", "tables=tables_file", "topology.hbm_gib=2", "launcher.nproc=2"]
    assert with_tables_file(argv) == argv  # a rank started with these arguments reads the file again
    config.register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*argv[1:], f"out_dir={tmp_path / 'run'}"])
    s = config.settings_from_config(cfg)
    assert [(t.name, t.num_embeddings, t.pooling_factor) for t in s.specs] == [("a", 1000, 1.0), ("b", 5000, 3.0)]
    assert (s.topology.hbm_gib, s.topology.device, s.topology.world_size) == (2.0, "cpu", 2)  # command line, file, ranks
    assert s.constraints.for_table("b").sharding_types == (ShardingType.ROW_WISE,)
    assert cfg.tables_file == str(path)


@pytest.mark.parametrize("argv, message", [
    (["tables_file=a.yaml", "tables=criteo_small"], "tables_file=a.yaml: also tables=criteo_small; give either"),
    (["tables_file=a.yaml", "+tables_file=b.yaml"], "tables_file: given 2 times; give one file"),
    (["tables_file=nope/a.yaml"], "nope/a.yaml: cannot read tables file"),
])
def test_bad_tables_file_arguments(argv, message):
    with pytest.raises(ValueError, match=message):
        with_tables_file(["embshard-train", *argv])
