"""The real `Generator` for engines/hf/server.py: a transformers causal LM, greedy `generate`.

`--random-weights` builds Llama-2-7B's architecture with random weights on the GPU (no download;
timing per token is the checkpoint's, the text is meaningless) and a word-level tokenizer: one
token per whitespace-separated word, as the simulator counts them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from engines.hf.measure import LLAMA2_7B


class WordTokenizer:
    """One id per word (a stable hash), decoded as `w<id>` words: for random weights only."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [3 + zlib.crc32(w.encode()) % (self.vocab_size - 3) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return "".join(f" w{i}" for i in ids)


class TransformersGenerator:  # pragma: no cover - needs torch and, in practice, a GPU
    def __init__(
        self,
        model: str | None,
        *,
        attn: str = "sdpa",
        device: str = "cuda",
        max_model_len: int = 4096,
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

        self.torch = torch
        self.device = device
        self.max_model_len = max_model_len
        torch.manual_seed(seed)
        if model is None:
            self.tokenizer: Any = None
            self.words = WordTokenizer(LLAMA2_7B["vocab_size"])
            with torch.device(device):
                self.model = AutoModelForCausalLM.from_config(
                    LlamaConfig(**LLAMA2_7B), dtype=torch.bfloat16, attn_implementation=attn
                )
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForCausalLM.from_pretrained(
                model, dtype=torch.bfloat16, attn_implementation=attn
            ).to(device)
        self.model.eval()

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return self.words.encode(text)
        ids: list[int] = self.tokenizer(text)["input_ids"]
        return ids

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return self.words.decode(ids)
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("This model has no chat template: use /v1/completions.")
        ids: list[int] = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        return ids

    def generate(
        self, prompt: list[int], max_tokens: int, ignore_eos: bool, on_token: Callable[[int], None]
    ) -> str:
        from transformers.generation.streamers import BaseStreamer

        class Relay(BaseStreamer):  # type: ignore[misc]
            prompt_seen = False

            def put(self, value: Any) -> None:
                if not self.prompt_seen:  # the first call carries the prompt
                    self.prompt_seen = True
                    return
                for token in value.reshape(-1).tolist():
                    on_token(int(token))

            def end(self) -> None:
                pass

        eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False,
                                  "streamer": Relay(), "pad_token_id": eos or 0}  # fmt: skip
        if ignore_eos or eos is None:
            kwargs["min_new_tokens"] = max_tokens
        with self.torch.inference_mode():
            out = self.model.generate(self.torch.tensor([prompt], device=self.device), **kwargs)
        return "length" if out.shape[1] - len(prompt) >= max_tokens else "stop"
