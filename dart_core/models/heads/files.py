"""What both draft heads (DART and EAGLE-3) share on disk and about their target.

* the error family: :class:`HeadError` (a ValueError) with :class:`DartHeadError`,
  :class:`Eagle3HeadError` and :class:`HeadTargetMismatch` under it;
* one resolver for a head given as a local directory or a Hub id (:func:`resolve_head_files`),
  one reader (:func:`read_head_files`: ``config.json`` + ``model.safetensors``, or a published
  EAGLE-3 ``pytorch_model.bin``), one strict key/shape matcher (:func:`match_state_dict`),
  one writer (:func:`save_head`: ``config.json`` + ``model.safetensors``, written atomically);
* the target a head was made for: :func:`target_fingerprint`, :func:`describe_target`,
  :func:`check_head_matches_target`.

The published checkpoint layouts are described in :mod:`.dart` and :mod:`.eagle3`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path

import torch
from torch import nn

from ...config import dtype_name

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FINGERPRINT_VERSION = 1

#: keys a checkpoint may carry that we do not load (the target's embedding is used; RoPE is recomputed)
OPTIONAL_IGNORED_KEYS = ("embed_tokens.weight",)
OPTIONAL_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ---------------------------------------------------------------------------------------------- errors
class HeadError(ValueError):
    """A draft head checkpoint (DART or EAGLE-3) is missing, malformed, or made for another target."""


class DartHeadError(HeadError):
    """A DART head checkpoint is missing, malformed, or made for another target."""


class Eagle3HeadError(HeadError):
    """An EAGLE-3 head checkpoint is missing, malformed, or made for another target."""


class HeadTargetMismatch(HeadError):
    """The head was trained for another target model (raised as the head's own kind below)."""


class DartHeadTargetMismatch(HeadTargetMismatch, DartHeadError):
    """A DART head was trained for another target model."""


class Eagle3HeadTargetMismatch(HeadTargetMismatch, Eagle3HeadError):
    """An EAGLE-3 head was trained for another target model."""


_MISMATCH = {DartHeadError: DartHeadTargetMismatch, Eagle3HeadError: Eagle3HeadTargetMismatch}


def mismatch_class(error: type[HeadError]) -> type[HeadTargetMismatch]:
    """The target-mismatch error of a head whose errors are ``error``."""
    return _MISMATCH.get(error, HeadTargetMismatch)


# ---------------------------------------------------------------------------------------------- config
#: Caps on a head config's counts: beyond them the file is damaged, not a head. A draft head runs one
#: decoder layer (published configs say num_hidden_layers 1); DART runs draft_length + 1 rows per position
#: and the original trains 8.
MAX_HEAD_LAYERS = 64
FIELD_CAPS = {"draft_length": 64}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def config_number(d: dict, name: str, default, error: type[HeadError], integer: bool = False):
    """``d[name]`` (``default`` when absent) as a float, or an int when ``integer``; ``error`` naming the field
    when it is not a number (a string, list, null or, for an integer, a fraction)."""
    v = d.get(name, default)
    if not _is_number(v) or (integer and isinstance(v, float) and not (math.isfinite(v) and v.is_integer())):
        raise error(f"{name} must be {'an integer' if integer else 'a number'}, got {v!r}")
    return int(v) if integer else float(v)


def head_config_problems(c, extra_int_fields: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with a draft head's Llama-style config (DART and EAGLE-3 share these fields)."""
    problems = []
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "vocab_size", "draft_vocab_size", *extra_int_fields, "head_dim", "target_hidden_size"):
        v = getattr(c, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            problems.append(f"{name} must be a positive integer, got {v!r}")
        elif name in FIELD_CAPS and v > FIELD_CAPS[name]:
            problems.append(f"{name} {v} is over {FIELD_CAPS[name]}, more than any head drafts")
    # NaN passes every comparison as False: each check asks for the good range.
    if not (_is_number(c.rms_norm_eps) and math.isfinite(c.rms_norm_eps) and c.rms_norm_eps >= 0):
        problems.append(f"rms_norm_eps must be a finite number >= 0, got {c.rms_norm_eps!r}")
    if not (_is_number(c.rope_theta) and math.isfinite(c.rope_theta) and c.rope_theta > 0):
        problems.append(f"rope_theta must be a finite number > 0, got {c.rope_theta!r}")
    if not (isinstance(c.max_position_embeddings, int) and not isinstance(c.max_position_embeddings, bool)
            and c.max_position_embeddings >= 1):
        problems.append(f"max_position_embeddings must be an integer >= 1, got {c.max_position_embeddings!r}")
    if not (_is_number(c.initializer_range) and math.isfinite(c.initializer_range) and c.initializer_range >= 0):
        problems.append(f"initializer_range must be a finite number >= 0, got {c.initializer_range!r}")
    layers = c.extra.get("num_hidden_layers", 1) if isinstance(c.extra, dict) else 1
    if not (isinstance(layers, int) and not isinstance(layers, bool) and 1 <= layers <= MAX_HEAD_LAYERS):
        problems.append(f"num_hidden_layers must be an integer in 1..{MAX_HEAD_LAYERS} (a draft head runs one "
                        f"layer), got {layers!r}")
    if c.target is not None and not (isinstance(c.target, dict)
                                     and isinstance(c.target.get("fingerprint", ""), (str, type(None)))):
        problems.append(f"the target record must be an object with a string fingerprint, got {c.target!r:.80}")
    if not problems:
        if c.num_attention_heads % c.num_key_value_heads:
            problems.append(f"num_attention_heads ({c.num_attention_heads}) must be a multiple of "
                            f"num_key_value_heads ({c.num_key_value_heads})")
        if c.draft_vocab_size > c.vocab_size:
            problems.append(f"draft_vocab_size ({c.draft_vocab_size}) exceeds vocab_size ({c.vocab_size})")
        if c.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE, got {c.head_dim}")
    if not isinstance(c.hidden_act, str) or c.hidden_act not in ("silu", "swish"):
        problems.append(f"hidden_act {c.hidden_act!r} is not supported (only silu)")
    return problems


def llama_fields_for_target(target) -> dict:
    """The Llama-style config fields a new head for ``target`` (a TargetModel) takes from it."""
    cfg = target.config
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return dict(hidden_size=target.hidden_size, intermediate_size=int(cfg.intermediate_size),
                num_attention_heads=int(cfg.num_attention_heads),
                num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
                head_dim=target.head_dim, vocab_size=target.vocab_size, target_hidden_size=target.hidden_size,
                rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)), rope_theta=float(theta),
                max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
                target=describe_target(target))


def head_config_dict(c, architecture: str, target_key: str, **fields) -> dict:
    """A head config's ``config.json`` (``extra`` first, then the Llama fields, ``fields`` and the target record)."""
    d = dict(c.extra)
    d.setdefault("architectures", [architecture])
    d.setdefault("model_type", "llama")
    d.update(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
             num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
             num_hidden_layers=1, head_dim=c.head_dim, vocab_size=c.vocab_size,
             draft_vocab_size=c.draft_vocab_size, **fields, target_hidden_size=c.target_hidden_size,
             rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=None, hidden_act=c.hidden_act,
             max_position_embeddings=c.max_position_embeddings, initializer_range=c.initializer_range,
             pretraining_tp=1, tie_word_embeddings=False)
    if c.target is not None:
        d[target_key] = c.target
    return d


# ---------------------------------------------------------------------------------------------- target identity
@torch.no_grad()
def target_fingerprint(model: nn.Module, samples_per_tensor: int = 4096) -> str:
    """A SHA-256 (hex) of a target's weights that takes milliseconds even for large models.

    Per parameter (sorted by name, tied weights once): its name, shape and up to
    ``samples_per_tensor`` evenly spaced values rounded to bfloat16, so a model loaded in
    float32 or bfloat16 gets the same fingerprint, while any retrained or other model differs.
    """
    h = hashlib.sha256(f"dart-target-fingerprint-v{FINGERPRINT_VERSION}".encode())
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        flat = p.detach().reshape(-1)
        n = flat.numel()
        k = min(n, samples_per_tensor)
        idx = (torch.arange(k, dtype=torch.int64, device=flat.device) * (n - 1)) // max(k - 1, 1)
        vals = flat.index_select(0, idx).float().to(torch.bfloat16).cpu().view(torch.int16).numpy().tobytes()
        h.update(f"{name}:{tuple(p.shape)}:".encode())
        h.update(vals)
    return h.hexdigest()


def describe_target(target) -> dict:
    """What a head records about its target (TargetModel) in ``config.json`` (``dart_target`` / ``eagle3_target``)."""
    cfg = target.config
    archs = getattr(cfg, "architectures", None) or []
    return {"name": str(target.name), "architecture": archs[0] if archs else None,
            "model_type": getattr(cfg, "model_type", None), "hidden_size": int(target.hidden_size),
            "vocab_size": int(target.vocab_size), "num_hidden_layers": int(target.num_layers),
            "aux_layer_ids": list(target.aux_layer_ids), "fingerprint": target_fingerprint(target.model),
            "fingerprint_version": FINGERPRINT_VERSION}


def check_head_matches_target(config, target, source: str = "the DART head", check_fingerprint: bool = True, *,
                              train_command: str = "dart") -> None:
    """Raise :class:`HeadTargetMismatch` when the head cannot serve ``target`` (a TargetModel).

    For both heads (same config fields): ``train_command`` ("dart" or "eagle3") names the trainer in
    the hint and picks the error (:class:`DartHeadTargetMismatch` or :class:`Eagle3HeadTargetMismatch`)."""
    mismatch = Eagle3HeadTargetMismatch if train_command == "eagle3" else DartHeadTargetMismatch
    fix = (f"load the base model this head was made for, or train a head for this one with "
           f"`python -m dart_core.train {train_command} --target {target.name} --data ... --out DIR`")
    if config.target_hidden_size != target.hidden_size:
        raise mismatch(
            f"{source} reads aux features of a target with hidden size {config.target_hidden_size} "
            f"(fc.weight takes 3 x {config.target_hidden_size}), but the target {target.name} has hidden size "
            f"{target.hidden_size}; {fix}")
    if config.hidden_size != target.hidden_size:
        raise mismatch(
            f"{source} has hidden size {config.hidden_size} but shares the target's token embedding of size "
            f"{target.hidden_size} ({target.name}); {fix}")
    if config.vocab_size != target.vocab_size:
        raise mismatch(f"{source} is for a vocabulary of {config.vocab_size} tokens, but the target "
                       f"{target.name} has {target.vocab_size}; {fix}")
    rec = config.target
    if not rec:
        return  # a published head: shapes are all we can check
    mt = getattr(target.config, "model_type", None)
    if rec.get("model_type") not in (None, mt):
        raise mismatch(f"{source} was trained for a {rec.get('model_type')} target ({rec.get('name')}), "
                       f"but the target {target.name} is {mt}; {fix}")
    if rec.get("num_hidden_layers") not in (None, target.num_layers):
        raise mismatch(f"{source} was trained for a target with {rec.get('num_hidden_layers')} layers "
                       f"({rec.get('name')}), but {target.name} has {target.num_layers}; {fix}")
    if check_fingerprint and rec.get("fingerprint") and rec.get("fingerprint_version", 1) == FINGERPRINT_VERSION:
        fp = target_fingerprint(target.model)
        if fp != rec["fingerprint"]:
            raise mismatch(
                f"{source} was trained for the target {rec.get('name')!r} (weights fingerprint "
                f"{rec['fingerprint'][:12]}...), but the loaded target {target.name!r} has other weights "
                f"(fingerprint {fp[:12]}...); {fix}")


# ---------------------------------------------------------------------------------------------- checkpoint tensors
def validate_vocab_mapping(d2t: torch.Tensor, t2d: torch.Tensor, config, source: str,
                           error: type[HeadError] = DartHeadError) -> None:
    """d2t [V_d] integer offsets and t2d [V] bool must describe the same V_d distinct target ids."""
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise error(f"{source}: d2t must hold integer offsets (int64), got {d2t.dtype}")
    if t2d.dtype != torch.bool and (t2d.dtype.is_floating_point or not bool(((t2d == 0) | (t2d == 1)).all())):
        raise error(f"{source}: t2d must be a boolean mask, got {t2d.dtype}")
    ids = torch.arange(config.draft_vocab_size) + d2t.cpu().to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
        raise error(f"{source}: d2t maps draft ids outside the target vocabulary [0, {config.vocab_size})")
    mask = torch.zeros(config.vocab_size, dtype=torch.bool)
    mask[ids] = True
    if int(mask.sum()) != config.draft_vocab_size:
        raise error(f"{source}: d2t maps two draft ids to the same target id")
    if not torch.equal(mask, t2d.cpu().to(torch.bool)):
        raise error(f"{source}: d2t and t2d disagree on which target ids form the draft vocabulary")


def count_non_finite(t: torch.Tensor, chunk: int = 1 << 24) -> int:
    """NaN and inf values in a float tensor (in chunks: a large LM head needs no full-size mask)."""
    if not t.is_floating_point():
        return 0
    flat = t.reshape(-1)
    return sum(int((~torch.isfinite(part)).sum()) for part in flat.split(chunk))


def match_state_dict(state: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], config, source: str,
                     what: str, error: type[HeadError] = DartHeadError) -> dict[str, torch.Tensor]:
    """Strict key/shape matching shared by the DART and EAGLE-3 loaders.

    shapes: every expected key -> shape (``d2t``/``t2d`` may be absent when ``config.full_vocab``);
    ``embed_tokens.weight`` and ``*rotary_emb.inv_freq`` are allowed and dropped. Every problem
    (missing, unexpected, misshaped key) is collected into one ``error`` naming each key.
    """
    problems: list[str] = []
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        if key in shapes:
            if tuple(t.shape) != shapes[key]:
                problems.append(f"{key} has shape {list(t.shape)}, expected {list(shapes[key])}")
            out[key] = t
        elif key in OPTIONAL_IGNORED_KEYS or key.endswith(OPTIONAL_IGNORED_SUFFIXES):
            logger.debug("%s: ignoring %s (the target's embedding / recomputed RoPE are used)", source, key)
        else:
            problems.append(f"unexpected key {key}")
    for key in shapes:
        if key not in state:
            if key in ("d2t", "t2d") and config.full_vocab:
                continue
            why = (" (d2t/t2d may be absent only when draft_vocab_size equals vocab_size)"
                   if key in ("d2t", "t2d") else "")
            problems.append(f"missing key {key}{why}")
    if problems:
        raise error(f"{source} is not {what} for its config.json: " + "; ".join(problems))
    for key, t in out.items():
        bad = count_non_finite(t)
        if bad:
            raise error(f"{source}: {key} holds {bad} NaN or infinite value(s); the checkpoint is damaged: "
                        "download or train the head again")
    if "d2t" in out or "t2d" in out:
        if "d2t" not in out or "t2d" not in out:
            raise error(f"{source}: d2t and t2d must be present together")
        validate_vocab_mapping(out["d2t"], out["t2d"], config, source, error)
    return out


# ---------------------------------------------------------------------------------------------- files
def resolve_head_files(path_or_id: str | os.PathLike, *, kind: str, weights_names: tuple[str, ...], layout: str,
                       flag: str, error: type[HeadError]) -> tuple[Path, Path]:
    """``config.json`` and the weights file of a head given as a local directory or a Hub id.

    kind: "DART" / "EAGLE-3" (for messages); weights_names: accepted weights files, in preference
    order; layout: the published layout named in the message; flag: the command-line flag to check.
    """
    needs = f"config.json and {' or '.join(weights_names)} ({layout})"
    p = Path(path_or_id).expanduser()
    if p.is_dir():
        cfg = p / CONFIG_NAME
        if not cfg.is_file():
            raise error(f"{kind} head directory {p} has no {CONFIG_NAME}; it needs {needs}")
        for name in weights_names:
            if (p / name).is_file():
                return cfg, p / name
        missing = (f"no {weights_names[0]}" if len(weights_names) == 1
                   else "neither " + " nor ".join(weights_names))
        raise error(f"{kind} head directory {p} has {missing}; it needs {needs}")
    s = str(path_or_id)
    if s.startswith((".", "/", "~")) or s.count("/") != 1:
        raise error(f"{kind} head {s!r} is neither a local directory nor a Hub id (owner/name); check {flag}")
    from huggingface_hub import hf_hub_download
    offline = (" (HF_HUB_OFFLINE=1 is set: only heads already in the Hub cache load)"
               if os.environ.get("HF_HUB_OFFLINE") == "1" else "")
    try:
        cfg = Path(hf_hub_download(s, CONFIG_NAME))
    except Exception as exc:  # noqa: BLE001 - network/offline/missing repo: one clear message
        raise error(f"could not fetch the {kind} head {s!r} from the Hub{offline}: {exc}") from exc
    errors = []
    for name in weights_names:
        try:
            return cfg, Path(hf_hub_download(s, name))
        except Exception as exc:  # noqa: BLE001 - try the next file name, report all
            errors.append(f"{name}: {type(exc).__name__}")
    raise error(f"the Hub repo {s!r} has no {kind} weights{offline} ({'; '.join(errors)})")


def read_state(weights_path: Path, error: type[HeadError]) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file or (published EAGLE-3 heads) a ``pytorch_model.bin``."""
    if weights_path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(weights_path))
        except (SafetensorError, OSError) as exc:
            raise error(f"{weights_path}: not a readable safetensors file ({exc})") from None
    try:
        # weights_only: a .bin from the Hub must not run code when unpickled
        state = torch.load(str(weights_path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure: one clear message
        raise error(f"{weights_path}: not a readable PyTorch state dict ({exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise error(f"{weights_path}: expected a flat dict of tensors (a state_dict)")
    return state


def read_config(cfg_path: Path, error: type[HeadError]) -> dict:
    """The JSON object in ``cfg_path``; ``error`` naming the file for anything else, so a caller (the page
    marking a default head unavailable) needs to catch the head's error only."""
    fix = "download the head again or fix the file"
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except RecursionError:
        raise error(f"{cfg_path}: JSON nested too deeply to read (a head config is a flat object); {fix}") from None
    except (OSError, ValueError) as exc:   # ValueError: JSON and UTF-8 errors, a too-long integer
        raise error(f"{cfg_path}: not a readable JSON config ({exc}); {fix}") from None
    if not isinstance(raw, dict):
        raise error(f"{cfg_path}: expected a JSON object at the top level, found {type(raw).__name__}; {fix}")
    return raw


def fill_head(head, tensors: dict[str, torch.Tensor], path_or_id, target=None, *, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None):
    """Copy checked ``tensors`` into a new ``head``; with ``target`` move it to the target's device and dtype
    and attach the target's embedding. Returns the head in eval mode."""
    with torch.no_grad():
        params = dict(head.named_parameters())
        params.update(dict(head.named_buffers()))
        for key, t in tensors.items():
            dst = params[key]
            dst.copy_(t.to(torch.bool) if key == "t2d" else t.to(dst.dtype))
    head.source = str(path_or_id)
    if target is not None:
        head.to(device=target.device, dtype=dtype or target.dtype)
        head.attach_embedding(target.model.get_input_embeddings().weight)
    elif dtype is not None or device is not None:
        head.to(device=device, dtype=dtype)
    return head.eval()


def save_head(head, out_dir: str | os.PathLike, dtype: torch.dtype | None = torch.bfloat16) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (published key layout; float weights in ``dtype``).

    Both files are written under temporary names first, so a crash never leaves a half-written head."""
    from safetensors.torch import save_file
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, t in head.state_dict().items():
        t = t.detach().cpu()
        if t.is_floating_point() and dtype is not None:
            t = t.to(dtype)
        state[key] = t.contiguous()
    cfg = head.config.to_dict()
    cfg["torch_dtype"] = dtype_name(dtype or head.fc.weight.dtype)
    tmp_w, tmp_c = out / (WEIGHTS_NAME + ".tmp"), out / (CONFIG_NAME + ".tmp")
    save_file(state, str(tmp_w), metadata={"format": "pt"})
    tmp_c.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp_w, out / WEIGHTS_NAME)
    os.replace(tmp_c, out / CONFIG_NAME)
    return out
