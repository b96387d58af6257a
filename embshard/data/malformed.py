"""Counting (or refusing) malformed input records: a rank's tally, reported at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_EXAMPLES = 3


@dataclass
class MalformedLog:
    """Malformed records seen by one reader. strict: the first one raises ValueError instead."""

    strict: bool = False
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def record(self, where: str, reason: str) -> None:
        if self.strict:
            raise ValueError(f"{where}: {reason}; fix the record, or set data.strict=false to count and skip "
                             "malformed records")
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{where}: {reason}")
