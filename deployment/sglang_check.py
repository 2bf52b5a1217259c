"""`python -m deployment.sglang_check PLAN.json`: the plan's SGLang engines as SGLang resolves them, against the plan
(`deployment.check`, over `deployment.engines.sglang`)."""

from __future__ import annotations

from deployment.check import main

if __name__ == "__main__":
    main("sglang")
