"""KV-cache arithmetic: how much memory a context cap implies, from a Hugging Face ``config.json``.

Pure functions over a frozen :class:`KVSpec`; reading the file is gateway/tools/hfconfig.py, and
printing is gateway/tools/kvcommand.py.

Formulas (bytes, per sequence of ``C`` tokens, summed over layers ``l``)::

    MHA/GQA/MQA  layer_bytes = 2 (K and V) x kv_heads x head_dim x dtype_bytes
    MLA          layer_bytes = (kv_lora_rank + qk_rope_head_dim) x dtype_bytes
    sequence     = sum_l min(C, window_l) x layer_bytes      (window_l = infinity for full attention)
    total        = sequence x concurrent sequences

MLA (DeepSeek-V2/V3, Kimi-K2) caches one compressed latent per layer and token, shared by all heads,
instead of K and V per head: vLLM allocates it as one "head" of size ``kv_lora_rank + qk_rope_head_dim``
with no separate V (``ModelConfig.get_head_size``/``get_num_kv_heads`` and ``MLAAttentionSpec`` in
``vllm/v1/kv_cache_interface.py``); SGLang's ``MLATokenToKVPool`` holds the same row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

GB = 10**9
GIB = 2**30

#: Bytes per element of each KV dtype, by canonical name.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "fp8": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
    "fp8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "float8_e5m2": "fp8_e5m2",
}
# Defaults that transformers fills in for keys some shipped configs leave out (e.g. gemma-3-4b-it).
_MODEL_DEFAULTS: dict[str, dict[str, int]] = {
    "gemma3_text": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 4096,
    },
}
# Every n-th layer is global, the others slide: transformers' (i + 1) % n rule, when the config is implicit.
_IMPLICIT_PATTERN: dict[str, int] = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}


def normalize_dtype(name: str) -> str:
    """Canonical KV dtype name (``fp16``, ``bf16``, ``fp32``, ``fp8_e4m3``, ``fp8_e5m2``, ``int8``)."""
    key = name.strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {name!r}; use one of auto, fp32, fp16, bf16, fp8, fp8_e5m2, int8")
    return key


@dataclass(frozen=True)
class KVSpec:
    """Per-layer KV-cache layout: every layer caches ``tensors x kv_heads x head_dim`` elements a token.

    ``windows`` has one entry per attention layer: ``None`` for full attention, else the sliding
    window (the layer never holds more than that many tokens). MLA is ``tensors=1, kv_heads=1``.
    """

    kv_heads: int
    head_dim: int
    windows: tuple[int | None, ...]
    dtype: str = "fp16"
    tensors: int = 2
    mla: bool = False
    attention_heads: int | None = None
    max_context: int | None = None
    name: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kv_heads < 1 or self.head_dim < 1 or self.tensors not in (1, 2):
            raise ValueError(f"bad KV layout: kv_heads={self.kv_heads} head_dim={self.head_dim}")
        if not self.windows:
            raise ValueError("a KV spec needs at least one layer")
        if any(w is not None and w < 1 for w in self.windows):
            raise ValueError("sliding windows must be positive")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"KVSpec.dtype must be canonical, one of {', '.join(DTYPE_BYTES)}")

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    @property
    def sliding_layers(self) -> int:
        return sum(w is not None for w in self.windows)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def layer_bytes_per_token(self) -> int:
        """Bytes one token adds to one layer (K and V, or the MLA latent)."""
        return self.tensors * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes per token over all layers, as long as the context is within every window."""
        return self.num_layers * self.layer_bytes_per_token

    @property
    def kind(self) -> str:
        if self.mla:
            return "MLA"
        if self.kv_heads == 1:
            return "MQA"
        if self.attention_heads is None:
            return "MHA/GQA"
        return "MHA" if self.attention_heads == self.kv_heads else "GQA"


def bytes_per_sequence(spec: KVSpec, context_tokens: int) -> int:
    """KV bytes one sequence of ``context_tokens`` holds: sliding layers stop at their window."""
    if context_tokens < 0:
        raise ValueError("context_tokens must be >= 0")
    held = sum(context_tokens if w is None else min(context_tokens, w) for w in spec.windows)
    return held * spec.layer_bytes_per_token


def kv_bytes(spec: KVSpec, context_tokens: int, concurrency: int) -> int:
    """KV bytes for ``concurrency`` sequences each at ``context_tokens`` (no prefix sharing)."""
    if concurrency < 0:
        raise ValueError("concurrency must be >= 0")
    return bytes_per_sequence(spec, context_tokens) * concurrency


def max_concurrency(spec: KVSpec, context: int, kv_budget_bytes: int) -> int:
    """How many sequences at ``context`` tokens fit in ``kv_budget_bytes`` of KV cache."""
    if context < 1:
        raise ValueError("context must be >= 1 token")
    return max(0, kv_budget_bytes) // bytes_per_sequence(spec, context)


def kv_spec_from_params(
    layers: int,
    kv_heads: int,
    head_dim: int,
    kv_dtype: str = "fp16",
    *,
    attention_heads: int | None = None,
    sliding_window: int | None = None,
    name: str = "",
) -> KVSpec:
    """A uniform MHA/GQA/MQA spec; ``sliding_window`` (if given) applies to every layer."""
    if layers < 1:
        raise ValueError("layers must be >= 1")
    dtype = "fp16" if kv_dtype == "auto" else normalize_dtype(kv_dtype)
    return KVSpec(
        kv_heads=kv_heads,
        head_dim=head_dim,
        windows=(sliding_window,) * layers,
        dtype=dtype,
        attention_heads=attention_heads,
        name=name,
    )


def _int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def _need(cfg: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = _int(cfg, key)
        if value is not None:
            return value
    raise ValueError(f"config.json: missing {keys[0]}")


def _auto_dtype(cfg: Mapping[str, Any], outer: Mapping[str, Any]) -> tuple[str, str | None]:
    raw = next((c.get(k) for c in (cfg, outer) for k in ("torch_dtype", "dtype") if c.get(k)), None)
    if not isinstance(raw, str):
        return "bf16", "auto: config.json names no torch_dtype; assumed bf16"
    try:
        dtype = normalize_dtype(raw)
    except ValueError:
        raise ValueError(f"config.json: torch_dtype {raw!r} is not a KV dtype; pass an explicit one") from None
    if dtype == "fp32":  # engines serve float32 checkpoints in 16 bits (vLLM dtype=auto does)
        return "bf16", "auto: checkpoint is float32, served in 16 bits, so KV counted as bf16"
    return dtype, None


def _windows(cfg: Mapping[str, Any], layers: int, model_type: str) -> tuple[int | None, ...]:
    raw = cfg.get("sliding_window")
    window = None if raw is None or raw is False or (isinstance(raw, int) and raw <= 0) else _int(cfg, "sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:  # Qwen2-family: present but off
        return (None,) * layers
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        if len(layer_types) != layers:
            raise ValueError(f"config.json: layer_types has {len(layer_types)} entries for {layers} layers")
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    pattern = _int(cfg, "sliding_window_pattern") or _IMPLICIT_PATTERN.get(model_type)
    if pattern is not None:
        return tuple(window if (i + 1) % pattern else None for i in range(layers))
    first = _int(cfg, "max_window_layers") if cfg.get("use_sliding_window") is True else None
    if first is not None:  # Qwen2 with sliding on: layers from max_window_layers up slide
        return tuple(window if i >= first else None for i in range(layers))
    return (window,) * layers  # Mistral-style: every layer slides


def kv_spec_from_hf_config(
    cfg: Mapping[str, Any], kv_dtype: str = "auto", *, sliding_window: bool = True, name: str = ""
) -> KVSpec:
    """The KV layout of a Hugging Face ``config.json`` dict (multimodal: its ``text_config``).

    ``kv_dtype="auto"`` is the checkpoint's ``torch_dtype`` (float32 counted as bf16, as served).
    ``sliding_window=False`` counts sliding layers at full context, as an engine that allocates
    every layer for the whole context does.
    """
    text = cfg.get("text_config")
    inner: Mapping[str, Any] = text if isinstance(text, Mapping) else cfg
    model_type = str(inner.get("model_type") or cfg.get("model_type") or "")
    c: Mapping[str, Any] = {**_MODEL_DEFAULTS.get(model_type, {}), **inner}
    notes: list[str] = []
    layers = _need(c, "num_hidden_layers", "n_layer", "num_layers")
    heads = _need(c, "num_attention_heads", "n_head")
    if kv_dtype == "auto":
        dtype, note = _auto_dtype(c, cfg)
        notes += [note] if note else []
    else:
        dtype = normalize_dtype(kv_dtype)
    mtp = c.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and mtp > 0:
        notes.append("MTP (next-n) layers not counted: they add KV only with speculative decoding")
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else model_type
    label = name or str(cfg.get("_name_or_path") or arch)
    common: dict[str, Any] = {
        "dtype": dtype,
        "attention_heads": heads,
        "name": label,
        "max_context": _int(c, "max_position_embeddings"),
    }
    windows = _windows(c, layers, model_type)
    if not sliding_window and any(w is not None for w in windows):
        windows = (None,) * layers
        notes.append("sliding-window layers counted at full context (as if the engine allocates them so)")
    if c.get("kv_lora_rank") is not None:
        latent = _need(c, "kv_lora_rank") + _need(c, "qk_rope_head_dim")
        return KVSpec(kv_heads=1, head_dim=latent, windows=windows, tensors=1, mla=True, notes=tuple(notes), **common)
    kv_heads = _int(c, "num_key_value_heads") or (1 if c.get("multi_query") is True else heads)
    head_dim = _int(c, "head_dim")
    if head_dim is None:
        hidden = _need(c, "hidden_size", "n_embd", "d_model")
        if hidden % heads:
            raise ValueError(f"config.json: hidden_size {hidden} is not a multiple of {heads} heads")
        head_dim = hidden // heads
    return KVSpec(kv_heads=kv_heads, head_dim=head_dim, windows=windows, notes=tuple(notes), **common)


_CAP = re.compile(r"(\d+(?:\.\d+)?)([km]?)")


def parse_cap(text: str) -> int:
    """Token count from ``"256k"``, ``"64K"``, ``"1m"`` or ``"131072"`` (k = 1024, m = 1024**2)."""
    m = _CAP.fullmatch(text.strip().lower().replace("_", ""))
    value = Fraction(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2)] if m else Fraction(0)
    if value < 1 or value.denominator != 1:
        raise ValueError(f"bad token count {text!r}; use e.g. 256k, 64k or 131072")
    return int(value)


def parse_caps(text: str) -> list[int]:
    """A comma-separated list of token counts, e.g. ``"256k,64k"``."""
    return [parse_cap(part) for part in text.split(",")]


def parse_counts(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"bad --concurrency {text!r}; use whole numbers >= 1, e.g. 1,8,32")
    return [int(p) for p in parts]


def format_cap(tokens: int) -> str:
    """``262144`` -> ``"256k"``; counts that are not whole KiB stay as digits."""
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _size(n: int) -> str:
    return f"{n / GB:,.2f} GB ({n / GIB:,.2f} GiB)"


def _describe(spec: KVSpec) -> list[str]:
    per = spec.layer_bytes_per_token
    if spec.mla:
        shape = f"{spec.num_layers} layers x latent {spec.head_dim} (kv_lora_rank + qk_rope_head_dim)"
    else:
        shape = f"{spec.num_layers} layers x {spec.kv_heads} KV heads x head_dim {spec.head_dim}, K and V"
    windows = sorted({w for w in spec.windows if w is not None})
    upto = f" up to {windows[0]:,} tokens" if windows else ""
    lines = [
        f"{spec.name or 'model'}: {spec.kind}, {shape}, {spec.dtype} ({spec.dtype_bytes} B/element)",
        f"KV per token: {spec.bytes_per_token:,} bytes ({spec.bytes_per_token / 1024:,.2f} KiB){upto}",
    ]
    if windows:
        full = spec.num_layers - spec.sliding_layers
        held = f"hold at most {'/'.join(f'{w:,}' for w in windows)} tokens"
        if full:
            lines.append(
                f"sliding window: {spec.sliding_layers} of {spec.num_layers} layers {held}; past that "
                f"a token adds {full * per:,} bytes (the {full} full-attention layers)"
            )
        else:
            lines.append(f"sliding window: all {spec.num_layers} layers {held}, so KV stops growing there")
    return lines


def format_table(
    spec: KVSpec, caps: Sequence[int], concurrency: Sequence[int], *, budget_bytes: int | None = None
) -> str:
    """Plain-text table of KV memory per cap: per sequence and for N concurrent sequences."""
    if not caps or not concurrency or min(caps) < 1 or min(concurrency) < 1:
        raise ValueError("caps and concurrency need at least one value each, all >= 1")
    too_long = spec.max_context is not None and max(caps) > spec.max_context
    header = ["cap", "tokens", *(f"{n} sequence{'s' if n > 1 else ''}" for n in concurrency)]
    if budget_bytes is not None:
        header.append(f"fit in {budget_bytes / GB:,.4g} GB")
    rows = [header]
    for cap in caps:
        star = "*" if spec.max_context is not None and cap > spec.max_context else ""
        row = [format_cap(cap) + star, f"{cap:,}", *(_size(kv_bytes(spec, cap, n)) for n in concurrency)]
        if budget_bytes is not None:
            row.append(f"{max_concurrency(spec, cap, budget_bytes):,}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [*_describe(spec), "units: GB = 10^9 bytes, GiB = 2^30 bytes", ""]
    lines += [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    base = bytes_per_sequence(spec, caps[0])
    lines += [""] if len(caps) > 1 else []
    for cap in caps[1:]:
        diff = bytes_per_sequence(spec, cap) - base
        change = f"{abs(diff) / GB:,.2f} GB {'more' if diff > 0 else 'less'}" if diff else "the same"
        lines.append(
            f"{format_cap(cap)} instead of {format_cap(caps[0])}: {change} KV per sequence ({100 * diff / base:+.0f}%)"
        )
    if too_long:
        lines.append(f"* beyond the model's max_position_embeddings ({spec.max_context:,})")
    lines += [f"note: {n}" for n in spec.notes]
    return "\n".join(lines)
