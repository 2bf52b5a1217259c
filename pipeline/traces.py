"""Derive the compact per-length histogram of a request trace, as the shipped workloads are; a trace that records
prefix reuse (Mooncake's JSONL) is kept whole, its block ids with it, for the simulator's prefix caches.

    python -m pipeline.traces derive TRACE.csv OUT.npz
    python -m pipeline.traces derive conversation_trace.jsonl OUT.npz
    python -m pipeline.traces fit-sessions conversation_trace.jsonl   # a session workload's YAML, fitted to it
"""

from __future__ import annotations

import sys
from pathlib import Path

from costmodel.cli import run
from pipeline.errors import WorkloadError
from pipeline.planning.traces import (
    AZURE_ATTRIBUTION,
    MOONCAKE_ATTRIBUTION,
    derive_histogram,
    derive_prefix_trace,
    load_trace,
    sessions_yaml,
)

USAGE = "usage: python -m pipeline.traces derive TRACE OUT.npz | fit-sessions PREFIX_TRACE"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "fit-sessions":
        print(sessions_yaml(load_trace(argv[1])), end="")
        return 0
    if len(argv) != 3 or argv[0] != "derive":
        raise WorkloadError(USAGE)
    trace = load_trace(argv[1])
    try:
        if trace.blocks is not None:
            derive_prefix_trace(trace, Path(argv[2]), MOONCAKE_ATTRIBUTION)
        else:
            derive_histogram(trace, Path(argv[2]), AZURE_ATTRIBUTION)
    except OSError as err:
        raise WorkloadError(f"{argv[2]}: cannot write it ({err.strerror}): choose a writable path") from None
    print(
        f"{argv[2]}: {len(trace)} requests, input {trace.input_tokens.min()}-{trace.input_tokens.max()}, "
        f"output {trace.output_tokens.min()}-{trace.output_tokens.max()} tokens"
    )
    return 0


if __name__ == "__main__":
    run(lambda: main(sys.argv[1:]))
