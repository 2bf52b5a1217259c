"""`python -m deployment.vllm_check PLAN.json`: the plan's vLLM engines as vLLM resolves them, against the plan
(`deployment.check`, over `deployment.engines.vllm`)."""

from __future__ import annotations

from deployment.check import main

if __name__ == "__main__":
    main("vllm")
