"""Install layers: the planner's CLI loads no torch; a part that needs torch, imported without
it, fails with one line naming what to install; every console script prints the version.

"Without torch" is a subprocess whose sys.modules hides the modules (find_spec then finds none).
tests/packaging/test_wheel.py shows the same on a real install without torch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import embshard
from embshard import scripts

TORCH_HINT = ("needs torch, fbgemm_gpu, torchrec (not installed: torch); on CPU: pip install 'embshard[cpu]' && "
              "pip install --no-deps torchrec==1.8.0; on CUDA: pip install 'embshard[gpu]' (README: Install)")


def python(code: str, *hidden: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which the ``hidden`` modules are not installed."""
    hide = "".join(f"sys.modules[{m!r}] = None\n" for m in hidden)
    return subprocess.run([sys.executable, "-c", f"import sys\n{hide}{code}"], capture_output=True, text=True, timeout=120)


def test_planner_and_stats_clis_load_no_torch():
    run = python("import embshard.plan_cli, embshard.planner.report, embshard.scripts, embshard.stats.cli\n"
                 "print(sorted(m for m in ('torch', 'fbgemm_gpu', 'torchrec', 'aiohttp', 'safetensors') if m in sys.modules))")
    assert (run.returncode, run.stdout) == (0, "[]\n"), run.stderr


def test_serving_and_calibration_do_not_load_the_training_app():
    run = python("import embshard.serving.serve_cli, embshard.serving.rank, embshard.serving.export, embshard.calibrate.cli\n"
                 "print(sorted(m for m in sys.modules if m.startswith(('embshard.train.main', 'embshard.train.run', "
                 "'embshard.train.trainer'))))")
    assert (run.returncode, run.stdout) == (0, "[]\n"), run.stderr


@pytest.mark.parametrize("package, part", [
    ("embshard.runtime", "embshard.runtime"),
    ("embshard.train.main", "embshard-train (embshard.train)"),
    ("embshard.serving.serve_cli", "embshard-serve and embshard-export (embshard.serving)"),
    ("embshard.calibrate.cli", "embshard-calibrate (embshard.calibrate)"),
    ("embshard.models.dlrm", "embshard.models"),
    ("embshard.interop.torchrec", "embshard.interop"),
])
def test_torch_parts_without_torch_say_what_to_install(package, part):
    run = python(f"import {package}", "torch")
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == f"embshard.extras.MissingExtra: {part} {TORCH_HINT}"


def test_serving_without_its_layer_says_what_to_install():
    run = python("import embshard.serving", "aiohttp")
    assert run.stderr.splitlines()[-1] == ("embshard.extras.MissingExtra: embshard-serve and embshard-export (embshard.serving) "
                                           "needs aiohttp, safetensors (not installed: aiohttp); pip install 'embshard[serve]' "
                                           "(README: Install)")


@pytest.mark.parametrize("prog, args, part", [
    ("train", [], "embshard-train (embshard.train)"),
    ("serve", ["artifact=x"], "embshard-serve and embshard-export (embshard.serving)"),
    ("calibrate", [], "embshard-calibrate (embshard.calibrate)"),
    ("plan", ["tables=criteo_small", "topology=cpu", "planner.time_budget_s=0.5", "measure=true", "out={tmp}/p.json"],
     "measure=true"),
])
def test_console_script_without_torch_is_one_line(prog, args, part, tmp_path):
    argv = [f"embshard-{prog}", *(a.format(tmp=tmp_path) for a in args)]
    run = python(f"sys.argv = {argv!r}\nfrom embshard.scripts import {prog}\n{prog}()", "torch")
    assert run.returncode == 2
    assert run.stderr == f"embshard-{prog}: error: {part} {TORCH_HINT}\n"


@pytest.mark.parametrize("prog", sorted(scripts.APPS))
def test_version(prog, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [prog, "--version"])
    getattr(scripts, prog.removeprefix("embshard-"))()
    assert capsys.readouterr().out == f"{prog} {embshard.__version__}\n"
