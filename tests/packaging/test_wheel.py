"""The wheel as a user installs it: core dependencies only (no torch), Python 3.12 and 3.13.

The wheel is built from a copy of the checkout (no build/ folder of an earlier run reused);
for each Python version it goes into a fresh venv with the core dependencies only (pip's
download cache is all that is reused), and from a folder outside the checkout: embshard-plan
on a shipped table set and on a plain tables file, `--version`, the one-line error of an app
that needs torch, and the planner's tests against the installed package. About 45 s per
version on a 2-core machine with pip's cache warm (the first run downloads numpy, scipy, matplotlib).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import embshard
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("3.12", "3.13")
PLANNER_TESTS = ("tests/planner",)  # no torch at module level; tests/test_plan_cli.py runs from the checkout (its 16 CLI runs take a minute here)
NOT_COPIED = (".git", ".venv", "outputs", "multirun", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache")
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
    installed = sh(venv / "bin/python", "-m", "pip", "install", "-q", wheel, "pytest", cwd=work, timeout=600)
    assert installed.returncode == 0, errors(installed)
    t_install = time.perf_counter() - t0
    bin_ = venv / "bin"

    fast = ("planner.time_budget_s=0.5", "planner.use_ilp=false")
    shipped = sh(bin_ / "embshard-plan", "tables=criteo_small", "topology=cpu", "topology.world_size=4",
                 "topology.local_world_size=4", *fast, "out=shipped/plan.json", cwd=work)
    assert shipped.returncode == 0, shipped.stderr
    plan = ShardingPlan.load(work / "shipped/plan.json")
    assert [s.name for s in plan.specs] == [f"cat_{i}" for i in range(26)] and plan.spec("cat_2").num_embeddings == 100000
    assert (plan.topology.world_size, plan.topology.device) == (4, "cpu")
    assert (work / "shipped/plan.png").read_bytes()[:4] == b"\x89PNG"

    (work / "user.yaml").write_text(USER_FILE)
    user = sh(bin_ / "embshard-plan", "tables_file=user.yaml", "topology.hbm_gib=2", *fast, "out=user.json", cwd=work)
    assert user.returncode == 0, user.stderr
    plan = ShardingPlan.load(work / "user.json")
    assert [s.name for s in plan.specs] == ["a", "b", "c"]
    assert (plan.topology.world_size, plan.topology.local_world_size, plan.topology.hbm_gib) == (4, 2, 2.0)
    assert plan.placement("b").sharding_type is ShardingType.ROW_WISE

    probe = sh(bin_ / "python", "-c", "import embshard, importlib.metadata as m, importlib.util as u; "
               "print(embshard.__file__, m.version('embshard'), u.find_spec('torch') is None, sep='\\n')", cwd=work)
    assert probe.stdout.splitlines() == [str(venv / f"lib/python{version}/site-packages/embshard/__init__.py"),
                                         embshard.__version__, "True"], probe.stderr  # the installed package; no torch
    for prog in ("embshard-plan", "embshard-train", "embshard-serve", "embshard-export", "embshard-calibrate"):
        shown = sh(bin_ / prog, "--version", cwd=work)
        assert (shown.returncode, shown.stdout) == (0, f"{prog} {embshard.__version__}\n"), shown.stderr

    train = sh(bin_ / "embshard-train", "steps=1", cwd=work)
    assert train.returncode == 2
    assert train.stderr.count("\n") == 1 and train.stderr.startswith("embshard-train: error: embshard-train "), train.stderr
    assert "not installed: torch, fbgemm_gpu, torchrec" in train.stderr and "pip install 'embshard[cpu]'" in train.stderr

    for tests in PLANNER_TESTS:
        (work / tests).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / tests).is_dir() else shutil.copy)(ROOT / tests, work / tests)
    t1 = time.perf_counter()
    ran = sh(bin_ / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *PLANNER_TESTS, cwd=work, timeout=600)
    assert ran.returncode == 0, ran.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", ran.stdout).group(1))
    skipped = re.findall(r"SKIPPED \[\d+\] (\S+)", ran.stdout)
    assert passed >= 60 and all("test_search.py" in s for s in skipped), ran.stdout[-2000:]  # only TorchRec's export
    print(f"python {version}: venv and install {t_install:.1f} s, planner tests {time.perf_counter() - t1:.1f} s "
          f"({passed} passed), in all {time.perf_counter() - t0:.1f} s")
