"""Chat templates by name (``TEMPLATE_REGISTRY``), rendered to token ids without jinja.

Each template turns a list of ``{"role", "content"}`` messages into the exact prompt
string the model was trained on; ``encode_chat`` tokenizes it without adding BOS or
other special tokens (the templates spell every special token out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

Message = dict  # {"role": "system"|"user"|"assistant", "content": str}


@dataclass(frozen=True)
class ChatTemplate:
    """ChatML-style template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message.

    default_system   system message inserted when the conversation has none (None = no system turn)
    assistant_prefix text after the generation prompt's ``<|im_start|>assistant\\n``
                     (Qwen3 with thinking disabled puts an empty think block there)
    stop_strings     the end-of-turn marker(s) that end an answer
    """
    name: str
    default_system: str | None
    assistant_prefix: str = ""
    stop_strings: tuple[str, ...] = ("<|im_end|>",)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if not messages:
            raise ValueError("a chat needs at least one message; pass [{'role': 'user', 'content': ...}]")
        parts = []
        if self.default_system is not None and messages[0]["role"] != "system":
            parts.append(f"<|im_start|>system\n{self.default_system}<|im_end|>\n")
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant"):
                raise ValueError(f"unknown chat role {m.get('role')!r}; use 'system', 'user' or 'assistant'")
            parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        if add_generation_prompt:
            parts.append(f"<|im_start|>assistant\n{self.assistant_prefix}")
        return "".join(parts)

    def format(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The DART seeds' spelling: ``TEMPLATE_REGISTRY["qwen"].format(messages=[...])`` (= :meth:`render`)."""
        return self.render(messages, add_generation_prompt)

    @property
    def system_prompt(self) -> str:
        """The original repository's name for the default system message ("" when there is none)."""
        return self.default_system or ""


TEMPLATE_REGISTRY: dict[str, ChatTemplate] = {
    # SmolLM2-Instruct: ChatML with a fixed default system prompt (from its tokenizer config).
    "smollm2": ChatTemplate(
        name="smollm2",
        default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    # Qwen3 (the DART seeds' family), non-thinking mode: no default system prompt and an
    # empty think block, as Qwen3's template renders enable_thinking=False.
    "qwen": ChatTemplate(name="qwen", default_system=None, assistant_prefix="<think>\n\n</think>\n\n"),
    # Qwen2 / Qwen2.5 instruct models.
    "qwen2": ChatTemplate(name="qwen2", default_system="You are a helpful assistant."),
}


def get_template(name: str) -> ChatTemplate:
    try:
        return TEMPLATE_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown chat template {name!r}; choose one of {sorted(TEMPLATE_REGISTRY)} "
                         "(--template-name)") from None


def guess_template_name(model_type: str) -> str:
    """Default template for a target architecture (``config.model_type``)."""
    return {"qwen3": "qwen", "qwen2": "qwen2"}.get(model_type, "smollm2")


def check_text(text: object, what: str = "the prompt") -> str:
    """``text`` if it is a string of valid Unicode; else ConfigError (a ValueError) saying what is wrong and
    how to fix it. A lone surrogate (e.g. "\\ud800", from a broken JSON escape or a cut emoji) cannot be
    encoded as UTF-8, and the tokenizer would fail on it with a bare TypeError."""
    from ..config import ConfigError

    if not isinstance(text, str):
        raise ConfigError(f"{what} must be text (a str), got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise ConfigError(f"{what} is not valid Unicode text: character {exc.start} is a lone surrogate "
                          f"(U+{ord(bad):04X}), half of a character pair that lost its other half (e.g. a cut emoji "
                          "or a broken \\u escape); remove it or paste the text again") from None
    return text


def encode_chat(tokenizer, template: ChatTemplate, messages: Sequence[Message],
                add_generation_prompt: bool = True) -> list[int]:
    for i, m in enumerate(messages):
        if isinstance(m, dict):
            check_text(m.get("content"), "the prompt" if len(messages) == 1 else f"message {i + 1}'s content")
    text = template.render(messages, add_generation_prompt=add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))
