"""Free TCP ports on localhost for process-group rendezvous (launchers, tests, benchmarks)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port that was free a moment ago (the OS picks it); racy by nature, fine for local ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
