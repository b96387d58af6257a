"""The wheel as a user installs it: core dependencies only (no torch) on Python 3.12 and 3.13,
and the apps that need torch from the wheel on 3.11.

The wheel is built from a copy of the checkout (no build/ folder of an earlier run reused);
for each Python version it goes into a fresh venv with the core dependencies only (pip's
download cache is all that is reused), and from a folder outside the checkout: embshard-plan
on a shipped table set and on a plain tables file, embshard-stats on synthetic data, `--version`, the one-line error of an app
that needs torch, and the planner's tests against the installed package. About 45 s per
version on a 2-core machine with pip's cache warm (the first run downloads numpy, scipy, matplotlib).
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
import time
from pathlib import Path

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


def sh_all(cwd: Path, commands: dict[str, list], timeout: float = 300) -> dict[str, subprocess.CompletedProcess]:
    """Start every command at once, then wait for each: name -> its result."""
    procs = {name: subprocess.Popen([str(a) for a in args], cwd=cwd, env=clean_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, args in commands.items()}
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=timeout)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
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


@pytest.mark.parametrize("version", VERSIONS)
def test_wheel_installs_and_plans_without_torch(wheel, version, tmp_path):
    python = find_python(version)
    if python is None:
        pytest.skip(f"NO PYTHON {version} ON THIS MACHINE: the light install is untested on {version} "
                    f"(install it, e.g. pyenv install {version})")
    t0 = time.perf_counter()
    venv, work = tmp_path / "venv", tmp_path / "work"  # work: outside the checkout, where a user runs it
    work.mkdir()
    made = sh(python, "-m", "venv", venv, cwd=work)
    assert made.returncode == 0, made.stderr
    installed = sh(venv / "bin/python", "-m", "pip", "install", "-q", "--no-compile", wheel, "pytest", cwd=work, timeout=600)
    assert installed.returncode == 0, errors(installed)
    t_install = time.perf_counter() - t0
    bin_ = venv / "bin"

    (work / "user.yaml").write_text(USER_FILE)
    fast = ("planner.time_budget_s=0.5", "planner.use_ilp=false")
    runs = sh_all(work, {  # at once: each spends a second or more importing
        "shipped": [bin_ / "embshard-plan", "tables=criteo_small", "topology=cpu", "topology.world_size=4",
                    "topology.local_world_size=4", *fast, "out=shipped/plan.json"],
        "user": [bin_ / "embshard-plan", "tables_file=user.yaml", "topology.hbm_gib=2", *fast, "out=user.json"],
        "train": [bin_ / "embshard-train", "steps=1"],
        "stats": [bin_ / "embshard-stats", "tables=criteo_small", "num_samples=2000", "batch_size=1000",
                  "out=stats/tables/measured.yaml"],
        "probe": [bin_ / "python", "-c", "import embshard, importlib.metadata as m, importlib.util as u; "
                  "print(embshard.__file__, m.version('embshard'), u.find_spec('torch') is None, sep='\\n')"],
        **{prog: [bin_ / prog, "--version"] for prog in PROGS},
    })
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

    for tests in PLANNER_TESTS:
        (work / tests).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / tests).is_dir() else shutil.copy)(ROOT / tests, work / tests)
    t1 = time.perf_counter()
    ran = sh(bin_ / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *PLANNER_TESTS,
             *(f"--deselect={t}" for t in TIMING_TESTS), cwd=work, timeout=600)
    assert ran.returncode == 0, ran.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", ran.stdout).group(1))
    skipped = re.findall(r"SKIPPED \[\d+\] (\S+)", ran.stdout)
    assert passed >= 60 and all("test_search.py" in s for s in skipped), ran.stdout[-2000:]  # only TorchRec's export
    print(f"python {version}: venv and install {t_install:.1f} s, planner tests {time.perf_counter() - t1:.1f} s "
          f"({passed} passed), in all {time.perf_counter() - t0:.1f} s")


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

