"""A request's prompt length in tokens: exact for token ids, exact with the model's tokenizer, else estimated.

The router routes by input length, so a miscount sends a prompt near a range edge to the wrong
island. Given the model's `tokenizer.json` (the Hugging Face `tokenizers` format every model folder
ships), text is tokenized exactly; a chat request counts its messages' contents (the chat
template's few tokens per message are not counted). Without one, characters / `chars_per_token`
is an estimate (15-30 % off on code), and the router says so when it starts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

MAX_PROMPT_CHARS = 2_000_000  # past this a prompt is refused before it is counted (500k+ tokens: past any context)
THREAD_CHARS = 20_000  # a longer prompt is tokenized off the event loop, so other requests go on meanwhile


class BadRequest(ValueError):
    """The request cannot be routed; the message is the client's 400 reason."""


def prompt_text(body: dict[str, Any]) -> str | list[int]:
    """The prompt of an OpenAI-compatible or SGLang-native request: token ids, or its text."""
    for key in ("input_ids", "prompt"):
        v = body.get(key)
        if type(v) is list and v and type(v[0]) is int and type(v[-1]) is int:  # token ids (the engine checks each)
            return v
    if isinstance(body.get("messages"), list):
        parts = []
        for m in body["messages"]:
            if not isinstance(m, dict):
                raise BadRequest("`messages` must be a list of objects with `role` and `content`")
            content = m.get("content", "")
            if isinstance(content, list):  # OpenAI content parts: count their text
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(str(content))
        return "".join(parts)
    for key in ("prompt", "text"):
        v = body.get(key)
        if isinstance(v, str):
            return v
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
            return v[0]
    raise BadRequest("no prompt: give `prompt` (text or token ids), `messages`, `text` or `input_ids`")


class Counter:
    """Counts a prompt's tokens with the model's tokenizer, or estimates them from characters."""

    def __init__(self, tokenizer: str | Path | None, chars_per_token: float) -> None:
        self.chars_per_token = chars_per_token
        self.tokenizer: Any = None
        if tokenizer is not None:
            path = Path(tokenizer)
            path = path / "tokenizer.json" if path.is_dir() else path
            try:
                from tokenizers import Tokenizer

                self.tokenizer = Tokenizer.from_file(str(path))
            except Exception as err:  # tokenizers raises plain Exception for a malformed file
                raise ValueError(
                    f"{path}: cannot read the tokenizer ({err}); give the model's tokenizer.json"
                ) from None
        self.exact = self.tokenizer is not None

    async def __call__(self, body: dict[str, Any]) -> int:
        prompt = prompt_text(body)
        if isinstance(prompt, list):
            return len(prompt)
        if len(prompt) > MAX_PROMPT_CHARS:
            raise BadRequest(f"the prompt has {len(prompt):,} characters, past the router's {MAX_PROMPT_CHARS:,}")
        if self.tokenizer is None:
            return max(int(len(prompt) / self.chars_per_token), 1)
        if len(prompt) > THREAD_CHARS:  # tokenizers releases the GIL while it encodes
            return await asyncio.to_thread(self.count, prompt)
        return self.count(prompt)

    def count(self, text: str) -> int:
        """Tokens of `text` with the model's tokenizer (no special tokens)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
