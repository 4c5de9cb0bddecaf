"""A draft head's ``config.json``: one class for DART and EAGLE-3 heads, in the published Hugging Face layouts.

Both are one Llama-style decoder layer with the Llama fields; DART's adds ``draft_length`` (the mask slots it
drafts), and heads trained here record their target (``dart_target`` / ``eagle3_target``). What differs by kind
(the architecture name, the target record's key, the error class, the fields a file must carry) is in
:data:`HEAD_KINDS`.

    config = HeadConfig.from_dict(json.load(f), "dart", source="config.json")
    config = HeadConfig.for_target(target, "eagle3", draft_vocab_size=8192)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .files import (DartHeadError, Eagle3HeadError, HeadError, config_number, head_config_dict,
                    head_config_problems, llama_fields_for_target)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadKind:
    """What a config of one kind of head differs in.

    label          the head's name in messages ("DART", "EAGLE-3")
    architecture   ``architectures`` of the config.json it writes
    target_key     where a head trained here records its target
    error          the error its problems raise
    required       the fields a config.json must carry
    needs          the message's hint when some are missing
    draft_length   the default drafted depth (None: the kind has no draft_length)
    """
    label: str
    architecture: str
    target_key: str
    error: type[HeadError]
    required: tuple[str, ...]
    needs: str
    draft_length: int | None = None


_LLAMA_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "vocab_size", "draft_vocab_size")

HEAD_KINDS = {
    "dart": HeadKind("DART", "LlamaForCausalLMDart", "dart_target", DartHeadError, _LLAMA_FIELDS + ("draft_length",),
                     "a DART head config needs the Llama fields plus draft_length and draft_vocab_size",
                     draft_length=8),
    # Published EAGLE-3 configs may leave out num_key_value_heads (= heads) and draft_vocab_size (= vocab_size).
    "eagle3": HeadKind("EAGLE-3", "LlamaForCausalLMEagle3", "eagle3_target", Eagle3HeadError,
                       ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"),
                       "an EAGLE-3 head config needs the Llama fields (hidden_size, intermediate_size, "
                       "num_attention_heads, vocab_size)"),
}

#: Fields the config reads; every other field of a loaded config.json is kept in ``extra``.
_READ = set(_LLAMA_FIELDS) | {"head_dim", "target_hidden_size", "rms_norm_eps", "rope_theta", "hidden_act",
                              "max_position_embeddings", "initializer_range"}


@dataclass
class HeadConfig:
    """A draft head's ``config.json``: the Llama fields, ``draft_vocab_size``, DART's ``draft_length`` (None for
    EAGLE-3), optional ``head_dim`` / ``target_hidden_size``, and the target a head trained here was made for.

    kind    "dart" or "eagle3" (:data:`HEAD_KINDS`)
    target  what the head was trained for: {"name", "architecture", "model_type", "hidden_size",
            "vocab_size", "num_hidden_layers", "aux_layer_ids", "fingerprint"} (None for published
            heads, which are then checked by shape only)
    extra   every other field of a loaded config.json, written back unchanged on save
    """
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    draft_length: int | None = None
    head_dim: int | None = None
    target_hidden_size: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    target: dict | None = None
    extra: dict = field(default_factory=dict)
    kind: str = field(kw_only=True)

    def __post_init__(self) -> None:
        spec = HEAD_KINDS[self.kind]
        if self.draft_length is None:
            self.draft_length = spec.draft_length
        if self.head_dim is None and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                         for v in (self.hidden_size, self.num_attention_heads)):
            self.head_dim = self.hidden_size // self.num_attention_heads   # else reported below
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        problems = head_config_problems(self, extra_int_fields=("draft_length",) if spec.draft_length is not None else ())
        if problems:
            raise spec.error(f"invalid {spec.label} head config: " + "; ".join(problems))

    @property
    def full_vocab(self) -> bool:
        return self.draft_vocab_size == self.vocab_size

    @classmethod
    def from_dict(cls, d: dict, kind: str, source: str = "config.json", head_dim: int | None = None) -> "HeadConfig":
        """The config of a ``kind`` head from its config.json's fields; the kind's error names ``source``.
        head_dim: the value the weights imply (EAGLE-3: published heads may carry a ``head_dim`` copied from their
        target that their weights do not use), which wins over the file's."""
        spec = HEAD_KINDS[kind]
        error = spec.error
        missing = [k for k in spec.required if k not in d]
        if missing:
            raise error(f"{source}: missing field(s) {', '.join(missing)}; {spec.needs}")
        rope_scaling = d.get("rope_scaling")
        rope_type = (rope_scaling.get("rope_type", rope_scaling.get("type"))
                     if isinstance(rope_scaling, dict) else rope_scaling or None)
        if rope_type not in (None, "default"):
            raise error(f"{source}: rope_scaling {rope_scaling!r} is not supported (plain RoPE only); "
                        "remove the field if the head was trained without scaling")
        rope_params = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
        # null or absent: the rope_parameters' value or the default (0 is kept, and refused as a bad theta)
        theta_at = d if d.get("rope_theta") is not None else {"rope_theta": rope_params.get("rope_theta", 10000.0)}
        if head_dim is not None and d.get("head_dim") not in (None, head_dim):
            logger.info("%s: head_dim %s in the config, but the weights use %s; using the weights'", source,
                        d.get("head_dim"), head_dim)
        has_length = spec.draft_length is not None
        known = _READ | {spec.target_key} | ({"draft_length"} if has_length else set())
        extra = {k: v for k, v in d.items() if k not in known}
        draft_vocab = (d["draft_vocab_size"] if "draft_vocab_size" in spec.required
                       else d.get("draft_vocab_size") or d["vocab_size"])
        try:
            return cls(hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
                       num_attention_heads=d["num_attention_heads"],
                       num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                       vocab_size=d["vocab_size"], draft_vocab_size=draft_vocab,
                       draft_length=d["draft_length"] if has_length else None,
                       head_dim=head_dim if head_dim is not None else d.get("head_dim"),
                       target_hidden_size=d.get("target_hidden_size"),
                       rms_norm_eps=config_number(d, "rms_norm_eps", 1e-6, error),
                       rope_theta=config_number(theta_at, "rope_theta", 10000.0, error),
                       hidden_act=d.get("hidden_act", "silu"),
                       max_position_embeddings=config_number(d, "max_position_embeddings", 2048, error, integer=True),
                       initializer_range=config_number(d, "initializer_range", 0.02, error),
                       target=d.get(spec.target_key), extra=extra, kind=kind)
        except error as exc:
            raise error(f"{source}: {exc}") from None

    def to_dict(self) -> dict:
        spec = HEAD_KINDS[self.kind]
        fields = {"draft_length": self.draft_length} if spec.draft_length is not None else {}
        return head_config_dict(self, spec.architecture, spec.target_key, **fields)

    @classmethod
    def for_target(cls, target, kind: str, draft_vocab_size: int, draft_length: int | None = None) -> "HeadConfig":
        """A ``kind`` head config sized for ``target`` (a TargetModel), recording the target's identity."""
        return cls(**llama_fields_for_target(target), draft_vocab_size=int(draft_vocab_size),
                   draft_length=None if draft_length is None else int(draft_length), kind=kind)
