"""The wheel as a user installs it: core dependencies only (no torch) on Python 3.12 and 3.13,
and the apps that need torch from the wheel on 3.11.

The wheel is built from a copy of the checkout (no build/ folder of an earlier run reused);
for each Python version it goes into a fresh venv with the core dependencies only (pip's
download cache is all that is reused), and from a folder outside the checkout: embshard-plan
on a shipped table set and on a plain tables file, embshard-stats on synthetic data, `--version`, the one-line error of an app
that needs torch, and the planner's tests against the installed package. The versions' venvs are made, and all
their runs started, side by side (each run is one process: the two planner test runs, the longest, take a core
each): about 80 s for both on a 2-core machine with pip's cache warm (the first run downloads numpy, scipy,
matplotlib), where one after the other took 150-165 s.
On 3.11 the wheel goes into a venv that sees this interpreter's packages (torch, fbgemm-gpu-cpu,
torchrec) but not the checkout, and embshard-train, -serve, -export and -calibrate run from it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pytest
import yaml

import embshard
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.stats.measure import HOT_FRACTIONS

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("3.12", "3.13")
PROGS = ("embshard-plan", "embshard-train", "embshard-serve", "embshard-export", "embshard-calibrate", "embshard-stats")
PLANNER_TESTS = ("tests/planner",)  # no torch at module level; tests/test_plan_cli.py runs from the checkout (its 16 CLI runs take a minute here)
# the planner's speed tests (time budgets on 856 and 3,000 tables, ~15 s) run in the main suite; here the installed package
TIMING_TESTS = ("tests/planner/test_search.py::test_856_tables_on_128_ranks_plans_within_budget",
                "tests/planner/test_search.py::test_time_budget_is_honoured_on_a_large_input")
NOT_COPIED = (".git", ".venv", "outputs", "multirun", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache")
TRAIN_FILE = """tables:
  - {name: a, num_embeddings: 1000, embedding_dim: 16}
  - {name: b, num_embeddings: 5000, embedding_dim: 16, pooling_factor: 3.0}
topology: {hbm_gib: 1, device: cpu}
"""
USER_FILE = """tables:
  - {name: a, num_embeddings: 1000, embedding_dim: 16, pooling_factor: 2.0}
  - {name: b, num_embeddings: 50000, embedding_dim: 32, pooling_factor: 8.0}
  - {name: c, num_embeddings: 20, embedding_dim: 8, pooled: false}
topology: {world_size: 4, local_world_size: 2, hbm_gib: 1, device: cpu}
constraints:
  tables: {b: {sharding_types: [row_wise]}}
"""


def find_python(version: str) -> str | None:
    """pyenv's build of ``version`` (its shims fail for versions not selected), else one on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{version}.*/bin/python{version}"))
    if found:
        return str(found[-1])
    on_path = shutil.which(f"python{version}")
    if on_path and subprocess.run([on_path, "-V"], capture_output=True).returncode == 0:
        return on_path
    return None


def clean_env() -> dict[str, str]:
    """The caller's environment without what would point Python at the checkout or another venv."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HYDRA_FULL_ERROR")
    return {k: v for k, v in os.environ.items() if k not in drop}


def errors(run: subprocess.CompletedProcess) -> str:
    """The end of its stderr without pip's notes on this machine's local index folders."""
    return "\n".join(line for line in run.stderr.splitlines() if "is ignored: it is neither" not in line)[-3000:]


def sh(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def sh_all(cwd: Path | Mapping[str, Path], commands: dict[str, list], timeout: float = 300) -> dict[str, subprocess.CompletedProcess]:
    """Start every command at once (each in ``cwd``, or in ``cwd[name]``), then wait for each: name -> its result.
    Output goes to files, so that no process blocks on a full pipe while another is waited for."""
    with tempfile.TemporaryDirectory() as logs:
        procs = {}
        for i, (name, args) in enumerate(commands.items()):
            out, err = open(f"{logs}/{i}.out", "w+"), open(f"{logs}/{i}.err", "w+")
            where = cwd if isinstance(cwd, Path) else cwd[name]
            procs[name] = (subprocess.Popen([str(a) for a in args], cwd=where, env=clean_env(), stdout=out, stderr=err,
                                            text=True), out, err)
        results = {}
        for name, (proc, out, err) in procs.items():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                for other, _, _ in procs.values():
                    other.kill()
                raise
            texts = []
            for f in (out, err):
                f.seek(0)
                texts.append(f.read())
                f.close()
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, *texts)
        return results


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_COPIED))
    t0 = time.perf_counter()
    built = sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "dist", f"{src}/", cwd=base)
    assert built.returncode == 0, errors(built)
    (path,) = (base / "dist").glob("embshard-*.whl")
    print(f"built {path.name} in {time.perf_counter() - t0:.1f} s")
    return path


@dataclass
class LightInstall:
    """One Python version's venv with the wheel and its core dependencies, and what ran from it."""

    venv: Path
    work: Path  # outside the checkout, where a user runs it
    made: subprocess.CompletedProcess | None = None
    installed: subprocess.CompletedProcess | None = None
    runs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    install_s: float = 0.0


def light_commands(install: LightInstall) -> dict[str, list]:
    """Every check's command for one venv: the apps (each spends a second or more importing) and the planner tests."""
    bin_ = install.venv / "bin"
    fast = ("planner.time_budget_s=0.5", "planner.use_ilp=false")
    return {
        "shipped": [bin_ / "embshard-plan", "tables=criteo_small", "topology=cpu", "topology.world_size=4",
                    "topology.local_world_size=4", *fast, "out=shipped/plan.json"],
        "user": [bin_ / "embshard-plan", "tables_file=user.yaml", "topology.hbm_gib=2", *fast, "out=user.json"],
        "train": [bin_ / "embshard-train", "steps=1"],
        "stats": [bin_ / "embshard-stats", "tables=criteo_small", "num_samples=2000", "batch_size=1000",
                  "out=stats/tables/measured.yaml"],
        "probe": [bin_ / "python", "-c", "import embshard, importlib.metadata as m, importlib.util as u; "
                  "print(embshard.__file__, m.version('embshard'), u.find_spec('torch') is None, sep='\\n')"],
        **{prog: [bin_ / prog, "--version"] for prog in PROGS},
        "planner_tests": [bin_ / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *PLANNER_TESTS,
                          *(f"--deselect={t}" for t in TIMING_TESTS)],
    }


@pytest.fixture(scope="module")
def light_installs(wheel, tmp_path_factory) -> dict[str, LightInstall]:
    """Per Python version on this machine: a fresh venv, the wheel installed with its core dependencies, and every
    check's run; the versions side by side (venvs, installs, then all runs at once)."""
    base = tmp_path_factory.mktemp("light")
    pythons = {v: p for v in VERSIONS if (p := find_python(v)) is not None}
    installs = {v: LightInstall(base / v / "venv", base / v / "work") for v in pythons}
    for install in installs.values():
        install.work.mkdir(parents=True)
    t0 = time.perf_counter()
    for v, made in sh_all(base, {v: [python, "-m", "venv", installs[v].venv] for v, python in pythons.items()}).items():
        installs[v].made = made
    ready = {v: i for v, i in installs.items() if i.made.returncode == 0}
    pip = {v: [i.venv / "bin/python", "-m", "pip", "install", "-q", "--no-compile", wheel, "pytest"] for v, i in ready.items()}
    for v, installed in sh_all({v: i.work for v, i in ready.items()}, pip, timeout=600).items():
        installs[v].installed, installs[v].install_s = installed, time.perf_counter() - t0
    commands, where = {}, {}
    for v, install in installs.items():
        if install.installed is None or install.installed.returncode != 0:
            continue
        (install.work / "user.yaml").write_text(USER_FILE)
        for tests in PLANNER_TESTS:
            (install.work / tests).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (ROOT / tests).is_dir() else shutil.copy)(ROOT / tests, install.work / tests)
        for name, args in light_commands(install).items():
            commands[f"{v}/{name}"], where[f"{v}/{name}"] = args, install.work
    t1 = time.perf_counter()
    for key, run in sh_all(where, commands, timeout=600).items():
        v, name = key.split("/")
        installs[v].runs[name] = run
    print(f"venvs and installs {t1 - t0:.1f} s, every version's runs at once {time.perf_counter() - t1:.1f} s")
    return installs


@pytest.mark.parametrize("version", VERSIONS)
def test_wheel_installs_and_plans_without_torch(light_installs, version):
    if version not in light_installs:
        pytest.skip(f"NO PYTHON {version} ON THIS MACHINE: the light install is untested on {version} "
                    f"(install it, e.g. pyenv install {version})")
    install = light_installs[version]
    venv, work, runs = install.venv, install.work, install.runs
    assert install.made.returncode == 0, install.made.stderr
    assert install.installed.returncode == 0, errors(install.installed)

    assert runs["shipped"].returncode == 0, runs["shipped"].stderr
    plan = ShardingPlan.load(work / "shipped/plan.json")
    assert [s.name for s in plan.specs] == [f"cat_{i}" for i in range(26)] and plan.spec("cat_2").num_embeddings == 100000
    assert (plan.topology.world_size, plan.topology.device) == (4, "cpu")
    assert (work / "shipped/plan.png").read_bytes()[:4] == b"\x89PNG"

    assert runs["user"].returncode == 0, runs["user"].stderr
    plan = ShardingPlan.load(work / "user.json")
    assert [s.name for s in plan.specs] == ["a", "b", "c"]
    assert (plan.topology.world_size, plan.topology.local_world_size, plan.topology.hbm_gib) == (4, 2, 2.0)
    assert plan.placement("b").sharding_type is ShardingType.ROW_WISE

    assert runs["stats"].returncode == 0, runs["stats"].stderr  # the core measures access statistics without torch
    measured = yaml.safe_load((work / "stats/tables/measured.yaml").read_text())["tables"]
    assert len(measured) == 26 and all(len(t["hot_rows"]) == len(HOT_FRACTIONS) == 6 for t in measured), measured

    train = runs["train"]
    assert train.returncode == 2
    assert train.stderr.count("\n") == 1 and train.stderr.startswith("embshard-train: error: embshard-train "), train.stderr
    assert "not installed: torch, fbgemm_gpu, torchrec" in train.stderr and "pip install 'embshard[cpu]'" in train.stderr

    assert runs["probe"].stdout.splitlines() == [str(venv / f"lib/python{version}/site-packages/embshard/__init__.py"),
                                                 embshard.__version__, "True"], runs["probe"].stderr  # installed; no torch
    for prog in PROGS:
        assert (runs[prog].returncode, runs[prog].stdout) == (0, f"{prog} {embshard.__version__}\n"), runs[prog].stderr

    ran = runs["planner_tests"]
    assert ran.returncode == 0, ran.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", ran.stdout).group(1))
    skipped = re.findall(r"SKIPPED \[\d+\] (\S+)", ran.stdout)
    assert passed >= 60 and all("test_search.py" in s for s in skipped), ran.stdout[-2000:]  # only TorchRec's export
    print(f"python {version}: venv and install {install.install_s:.1f} s ({passed} planner tests passed)")


def test_torch_apps_run_from_the_wheel(wheel, tmp_path):
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    assert sh(sys.executable, "-m", "venv", venv, cwd=work).returncode == 0
    installed = sh(venv / "bin/python", "-m", "pip", "install", "-q", "--no-compile", "--no-deps", wheel, cwd=work)
    assert installed.returncode == 0, errors(installed)
    site = sh(venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work).stdout.strip()
    (Path(site) / "stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch and friends, after the wheel
    probe = sh(venv / "bin/python", "-c", "import embshard, torch, torchrec; print(embshard.__file__)", cwd=work)
    assert probe.stdout == f"{site}/embshard/__init__.py\n", probe.stderr

    (work / "mine.yaml").write_text(TRAIN_FILE)
    train = sh(venv / "bin/embshard-train", "tables_file=mine.yaml", "experiment=smoke", "launcher.nproc=2",
               "topology.hbm_gib=2", "out_dir=run", cwd=work)  # 2 ranks: each reads the configs and the file again
    assert train.returncode == 0, train.stderr[-3000:]
    plan = ShardingPlan.load(work / "run/plan.json")
    assert [s.name for s in plan.specs] == ["a", "b"] and (plan.topology.world_size, plan.topology.hbm_gib) == (2, 2.0)
    assert (work / "run/checkpoints/step_000020").is_dir()
    keys = {"serve": "artifact: null", "export": "dtype: fp32", "calibrate": "out_dir: outputs/calibrate/topology"}
    shown = sh_all(work, {prog: [venv / f"bin/embshard-{prog}", "--cfg", "job"] for prog in keys})
    for prog, key in keys.items():
        assert shown[prog].returncode == 0 and key in shown[prog].stdout.splitlines(), shown[prog].stderr

