"""The plan's router: OpenAI-compatible in front, length-routed disaggregated prefill/decode behind.

    python -m deployment.router routing.json [--host 0.0.0.0] [--port 8000]

`routing.json` is written by `python -m pipeline.deploy`: per phase, each serving island's engines and its
share of every input-length range. For a request (`/v1/completions`, `/v1/chat/completions`,
`/generate`) the router:
1. estimates its prompt length in tokens: exact for token ids (`prompt` / `input_ids` lists),
   else characters / `chars_per_token` (set it from your tokenizer);
2. finds the range, draws a prefill island and a decode island with the plan's fractions for
   that range (as the simulator's `plan` router does), then one engine of each at random;
3. forwards it in the engines' disaggregation protocol:
   - `sglang`: the request, with `bootstrap_host`, `bootstrap_port` and a random
     `bootstrap_room` added, goes to the prefill and the decode engine at once; the decode
     engine's answer (streamed or not) is the response;
   - `vllm`: the prefill engine first, with `max_tokens` 1 and `kv_transfer_params`
     `{"do_remote_decode": true}`; then the decode engine with the `kv_transfer_params` the
     prefill returned; its answer is the response.

Built on aiohttp (server and client); `GET /routing` shows the loaded table, `GET /health` answers
200. Errors from an engine are passed through with their status.
"""

from __future__ import annotations

from deployment.router.app import app
from deployment.router.table import Table, load, pick, prompt_tokens

__all__ = ["Table", "app", "load", "pick", "prompt_tokens"]
