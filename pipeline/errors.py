"""Error types a user can act on; the CLI prints them as one line and exits with 2."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload description or trace that cannot be used; the message says what and where."""
