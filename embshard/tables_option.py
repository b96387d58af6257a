"""`tables_file=PATH` for embshard-plan and embshard-train: a plain YAML tables file anywhere on disk.

    embshard-plan tables_file=my_tables.yaml topology.world_size=16

The file holds a `tables:` list and optional `topology:` and `constraints:` blocks, no Hydra
header (checked by embshard.specs.read_tables_file, errors name the file and the field). It
becomes the tables group's option ``tables=tables_file`` in Hydra's ConfigStore, so it merges
as a shipped option does: over the topology group, under the command line's overrides.
Ranks started by embshard-train get the same arguments and read the file again.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore

from embshard.specs import read_tables_file

OPTION = "tables_file"  # the key on the command line, and the tables group's option it selects


def with_tables_file(argv: list[str]) -> list[str]:
    """Register the file of a ``tables_file=PATH`` argument; returns argv that selects it (``tables=tables_file`` next to it)."""
    paths = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+") == OPTION]
    if not paths or paths == ["null"]:
        return argv
    if len(paths) > 1:
        raise ValueError(f"{OPTION}: given {len(paths)} times; give one file")
    chosen = [a for a in argv if a.split("=", 1)[0].lstrip("+") == "tables"]
    if chosen not in ([], [f"tables={OPTION}"]):
        raise ValueError(f"{OPTION}={paths[0]}: also {chosen[0]}; give either tables=NAME (a shipped or --config-dir "
                         f"option) or {OPTION}=PATH (a file anywhere), not both")
    blocks = {k: v for k, v in read_tables_file(Path(paths[0]).expanduser()).items() if v is not None}
    ConfigStore.instance().store(group="tables", name=OPTION, node=blocks, package="_global_")
    if chosen:
        return argv
    at = next(i for i, a in enumerate(argv) if a.split("=", 1)[0].lstrip("+") == OPTION) + 1  # among the overrides
    return [*argv[:at], f"tables={OPTION}", *argv[at:]]
