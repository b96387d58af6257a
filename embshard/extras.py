"""The install layers (pyproject extras) and the one-line error when a part's layer is missing.

    from embshard.extras import require
    require("embshard.runtime", "torch")   # first line of a package that needs torch

The core (planner, dry run, report, chart) needs none of them. `require` only looks the
modules up (no import), so a launcher that checks a config still loads no torch.
"""

from __future__ import annotations

import importlib.util

# layer -> (modules it provides, how to install it)
LAYERS = {
    "torch": (("torch", "fbgemm_gpu", "torchrec"),
              "on CPU: pip install 'embshard[cpu]' && pip install --no-deps torchrec==1.8.0; "
              "on CUDA: pip install 'embshard[gpu]' (README: Install)"),
    "serve": (("aiohttp", "safetensors"), "pip install 'embshard[serve]' (README: Install)"),
}


class MissingExtra(ModuleNotFoundError):
    """A part of embshard was imported without its install layer; the message says what to install."""


def require(part: str, *layers: str) -> None:
    """Raise MissingExtra naming the missing modules and the install command unless ``layers`` are installed."""
    for layer in layers:
        modules, install = LAYERS[layer]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingExtra(f"{part} needs {', '.join(modules)} (not installed: {', '.join(missing)}); {install}",
                               name=missing[0])
