"""The plan's router: OpenAI-compatible in front, length-routed disaggregated prefill/decode behind.

    python -m deployment.router routing.json [--port 8000] [--host 127.0.0.1] [--tokenizer tokenizer.json]

`routing.json` is written by `python -m pipeline.deploy`: per phase, each serving island's engines and
its share of every input-length range. `table` reads, checks and indexes it, `tokens` counts a prompt,
`app` forwards requests in the engines' disaggregation protocol with admission, retries, health
checks and ejection, `upstream` is its HTTP client to the engines (what an engine sends that is not
HTTP is refused there), `clients` bounds the client connections (header and body timeouts, a cap),
`metrics` exposes Prometheus counters, `__main__` is the command (loopback by default, an API key,
graceful drain on SIGTERM). docs/deploy.md explains what it does and why no existing router could.
"""

from __future__ import annotations

from deployment.router.app import Settings, app
from deployment.router.table import RoutingError, Table, load, pick
from deployment.router.tokens import Counter, prompt_text

__all__ = ["Counter", "RoutingError", "Settings", "Table", "app", "load", "pick", "prompt_text"]
