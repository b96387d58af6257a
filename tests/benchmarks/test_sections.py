"""benchmarks/sections.commit_label: the commit a results file names, marked where the code differs from it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_commit_label_marks_code_changes_not_results(tmp_path: Path, load_benchmark) -> None:
    label = load_benchmark("sections").commit_label
    repo = tmp_path / "repo"
    for path in ("embshard/planner/a.py", "embshard/runtime/b.py", "benchmarks/results/runtime.md"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("one\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    head = _git(repo, "rev-parse", "--short", "HEAD")
    assert label(root=repo) == head
    (repo / "benchmarks/results/runtime.md").write_text("a run's results\n")  # what a run writes: not code
    assert label(root=repo) == head
    assert label(["embshard/planner"], root=repo) == head
    (repo / "embshard/runtime/b.py").write_text("two\n")
    assert label(root=repo) == f"{head} (uncommitted changes)"
    assert label(["embshard/planner"], root=repo) == head  # outside the folders that count
    (repo / "embshard/planner/a.py").write_text("two\n")
    assert label(["embshard/planner"], root=repo) == f"{head} (uncommitted changes under embshard/planner)"
