"""What machine a measurement ran on: the CPU model (for profiles and benchmark results)."""

from __future__ import annotations

import platform
import shutil
import subprocess


def cpu_model() -> str:
    """The CPU's model name from lscpu ("AMD EPYC ..."), else what platform knows, else "unknown"."""
    if shutil.which("lscpu"):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"
