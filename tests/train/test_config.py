"""configs/train.yaml: every option of every group composes against the typed schema and
instantiates (values, model, data stream, optimizer, plan); typos and wrong types fail at
composition with the key named, and the CLI says so in one line (once, under torchrun too)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf.errors import OmegaConfBaseException

from embshard import cli, planner
from embshard.cli import CONFIG_DIR
from embshard.comms import CommsPrecision
from embshard.data.batch import FeatureLayout
from embshard.data.stream import open_stream
from embshard.models.dlrm import DLRM
from embshard.ports import free_port
from embshard.runtime import OptimizerConfig
from embshard.train import config
from embshard.train.trainer import dense_optimizer
import train_tables

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = Path(CONFIG_DIR)
CLI = str(Path(sys.executable).parent / "embshard-train")
GROUPS = ("tables", "topology", "planner", "model", "data", "optim", "launcher", "experiment")
config.register()


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("data")
    line = "\t".join(["1", *["3"] * 13, *["a1b2"] * 26])
    (root / "day_0.tsv").write_text((line + "\n") * 8)
    rng = np.random.default_rng(0)
    for day in (0, 23):
        np.save(root / f"day_{day}_dense.npy", rng.random((8, 13), dtype=np.float32))
        np.save(root / f"day_{day}_sparse.npy", rng.integers(0, 1000, (8, 26)))
        np.save(root / f"day_{day}_labels.npy", rng.integers(0, 2, (8, 1)))
    return {"data=criteo_tsv": [f"data.train_files=[{root}/day_0.tsv]", f"data.eval_files=[{root}/day_0.tsv]"],
            "data=criteo_npy": [f"data.dir={root}", "data.eval_days=[23]"]}


def settings(overrides: list[str]) -> config.TrainSettings:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["out_dir=/tmp/unused", *overrides])
    return config.settings_from_config(cfg)


OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONFIGS / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_instantiates(group: str, option: str, data_files) -> None:
    choice = f"{group}={option}"
    s = settings([choice, *data_files.get(choice, [])])
    assert s.specs and s.topology.world_size >= 1
    small = s.specs if sum(t.num_embeddings for t in s.specs) < 2_000_000 else None
    if group in ("model", "data") or choice == "experiment=sequence":
        layout = FeatureLayout.from_specs(small, max_history_length=s.model.sequence.max_history_length)
        b = next(open_stream(s.data, layout, 0, 1, 4, "train"))
        out = DLRM(s.model, small, layout.num_dense)(b.dense, b.sparse, b.sequence)
        assert out.shape == (4,) and torch.isfinite(out).all()
    if group == "optim":
        dense_optimizer(s.optim.dense, [torch.nn.Parameter(torch.zeros(3))])
        OptimizerConfig(**asdict(s.optim.sparse))
        assert {t.optimizer for t in s.specs} == {s.optim.table_optimizer or "rowwise_adagrad"}
    if group == "planner":
        p = s.planner
        plan = planner.plan(s.specs, s.topology, s.constraints, time_budget_s=min(p.time_budget_s, 0.5), use_ilp=p.use_ilp,
                            ilp_time_s=p.ilp_time_s, torchrec_compatible=p.torchrec_compatible)
        assert {t.name for t in plan.tables} == {t.name for t in s.specs}
    if choice == "experiment=dcnv2_mlperf":
        assert s.model.interaction == "dcn" and s.topology.device == "cuda" and len(s.data.train_days) == 23


@pytest.mark.parametrize("choice", ["topology=train_cpu", "topology=train_gpu", "topology=cpu", "topology=gpu",
                                    "tables=criteo_tb", "experiment=dcnv2_mlperf"])
def test_world_size_follows_the_ranks_whatever_the_topology(choice: str, monkeypatch) -> None:
    s = settings([choice, "launcher.nproc=3"])
    assert (s.topology.world_size, s.topology.local_world_size) == (3, 3)
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # under torchrun
    s = settings([choice, "launcher.nproc=3"])
    assert (s.topology.world_size, s.topology.local_world_size) == (16, 8)


def test_sequence_experiment_adds_the_item_table() -> None:
    assert settings(["experiment=sequence"]).specs[-1].feature_names == ("history", "target")


@pytest.mark.parametrize("override,needle", [
    ("model.bottom_mlpp=[1]", "bottom_mlpp"),
    ("steps=abc", "steps"),
    ("optim.dense.learning_rate=fast", "optim.dense.learning_rate"),
    ("data.id_skeww=1", "id_skeww"),
    ("tables=typo", "rowz"),
])
def test_typos_and_wrong_types_fail_at_composition_with_the_key(override: str, needle: str, tmp_path) -> None:
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "typo.yaml").write_text(
        "# @package _global_\ntables:\n  - {name: a, num_embeddings: 5, embedding_dim: 16, rowz: 1}\n")
    with pytest.raises(Exception, match=needle) as e:
        settings([f"hydra.searchpath=[file://{tmp_path}]", override])
    assert isinstance(e.value, OmegaConfBaseException) or "Hydra" in type(e.value).__module__ or "hydra" in type(e.value).__module__


@pytest.mark.parametrize("override,needle", [
    ("optim.dense.name=rmsprop", "optim.dense.name: must be one of ['sgd', 'adagrad', 'adam'], got 'rmsprop'"),
    ("model.top_mlp=[8,2]", "model.top_mlp: the last layer must have width 1"),
    ("steps=0", "steps: must be positive, got 0"),
    ("tables.0.num_embeddings=-3", "tables[0] (cat_0).num_embeddings: must be a positive integer, got -3"),
    ("data=criteo_npy", "data.eval_days: empty"),
    ("experiment=sequence model.sequence.table=cat_3", "model.sequence.table: 'cat_3' is already a table"),
])
def test_bad_values_are_refused_with_the_key_and_a_fix(override: str, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        settings(override.split())
    assert needle in str(e.value)


def test_a_saved_plan_must_fit_the_run() -> None:
    from embshard.train.planning import check_plan_file

    s = settings(["plan_file=plan.json"])
    plan = planner.plan(s.specs, s.topology, time_budget_s=0.2)
    check_plan_file(plan, s, s.topology.world_size)
    with pytest.raises(ValueError, match=r"plan_file=plan.json: the plan is for 1 ranks but 2 run; plan again"):
        check_plan_file(plan, s, 2)
    other = settings(["plan_file=plan.json", "experiment=sequence"])
    with pytest.raises(ValueError, match=r"the run has tables missing from it \['item'\]"):
        check_plan_file(plan, other, 1)
    wider = settings(["plan_file=plan.json", "tables.0.num_embeddings=7"])
    with pytest.raises(ValueError, match=r"table 'cat_0'.num_embeddings is 1460 in the plan but 7 in this run"):
        check_plan_file(plan, wider, 1)
    zero = settings(["plan_file=plan.json", "optim.sharded_update=true"])  # the plan's data-parallel updates are not sharded
    with pytest.raises(ValueError, match=r"topology.sharded_dp_update=False but this run optim.sharded_update=True; "
                                         r"set optim.sharded_update=false"):
        check_plan_file(plan, zero, 1)


CLI_CASES = {
    "typo": (["model.bottom_mlpp=[1]"], "bottom_mlpp"),
    "wrong_type": (["steps=abc"], "steps"),
    "unknown_option": (["model=nope"], "Could not find 'model/nope'"),
    "bad_value": (["optim.table_optimizer=lamb"], "optim.table_optimizer: must be one of"),
    # refused by the launcher before it starts the ranks (each rank would print the error again)
    "not_utf8": (["--config-dir={tmp}", "tables=picture", "launcher.nproc=2"],
                 "{tmp}/tables/picture.yaml: not UTF-8 text (invalid start byte at byte 0)"),
    "no_ranks": (["launcher.nproc=0"], "launcher.nproc: must be a positive number of local ranks, got 0"),
    "ranks_mismatch": (["launcher.nproc=2", "topology.world_size=4"],
                       "topology: world_size=4, local_world_size=2 but 2 rank(s) run, 2 per host"),
    "data_dir": (["launcher.nproc=2", "data=criteo_tsv", "data.train_files=[{tmp}]", "data.eval_files=[{tmp}]"],
                 "data.train_files[0]: {tmp} is a directory, not a Criteo day file"),
}


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, str]]:
    """name -> (the finished command, the text its one line must hold)."""
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "tables").mkdir()
    (tmp / "tables" / "picture.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    procs = {name: subprocess.Popen([CLI, *(a.format(tmp=tmp) for a in args)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=tmp)
             for name, (args, _) in CLI_CASES.items()}
    return {name: (subprocess.CompletedProcess(p.args, p.wait(timeout=120), *p.communicate()),
                   CLI_CASES[name][1].format(tmp=tmp)) for name, p in procs.items()}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_bad_input_is_one_line_and_status_2(case: str, cli_runs) -> None:
    run, needle = cli_runs[case]
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert lines[0].startswith("embshard-train: error: ") and needle in lines[0], lines[0]


@pytest.mark.parametrize("local_rank, waits", [("0", False), ("1", True)])
def test_under_torchrun_a_config_error_is_printed_by_the_hosts_first_process(local_rank, waits, monkeypatch,
                                                                            capsys) -> None:
    for key, value in {"RANK": "5", "LOCAL_RANK": local_rank, "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    slept = []
    monkeypatch.setattr(cli.time, "sleep", lambda s: slept.append((s, capsys.readouterr().err)))
    with pytest.raises(SystemExit) as exit_:
        cli.fail_config("prog", "steps: bad")
    # the others wait (torchrun stops them when the first exits), and print only if still running after the wait
    assert exit_.value.code == 2 and slept == ([(cli.QUIET_RANK_WAIT_S, "")] if waits else [])
    assert capsys.readouterr().err == "prog: error: steps: bad\n"


def test_torchrun_processes_print_a_config_error_once(tmp_path) -> None:
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "3"]
    cases = {"steps": ["steps=abc"], "optim.table_optimizer: must be one of": ["optim.table_optimizer=lamb"]}
    procs = {needle: subprocess.Popen([*torchrun, "--master-port", str(free_port()), "-m", "embshard.train", *args,
                                       f"out_dir={tmp_path / str(i)}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=tmp_path)
             for i, (needle, args) in enumerate(cases.items())}
    for needle, p in procs.items():
        out, err = p.communicate(timeout=120)
        lines = [line for line in (out + err).splitlines() if "embshard-train: error:" in line]
        assert len(lines) == 1 and needle in lines[0], err[-3000:]  # was one line per process (of those not stopped)


def test_wire_dtypes_are_planner_options(config_dir, tmp_path) -> None:
    s = train_tables.settings(config_dir, tmp_path / "ok", "planner.comms.forward=fp16", "planner.comms.backward=bf16")
    assert s.planner.comms == CommsPrecision("fp16", "bf16", "fp32")
    with pytest.raises(ValueError, match=r"comms.forward: 'int8' is not a wire dtype; give one of \['fp32', 'fp16', 'bf16'\]"):
        train_tables.settings(config_dir, tmp_path / "bad", "planner.comms.forward=int8")
    with pytest.raises(ValueError, match=r"topology.comms: .* set the wire dtypes with planner.comms"):
        train_tables.settings(config_dir, tmp_path / "topo", "topology.comms.forward=fp16")
