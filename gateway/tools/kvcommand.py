"""`gateway kv`: the command line of gateway.policy.kv, KV-cache memory for a context cap. Parses its
arguments, prints the table, and turns bad input into one clear line on stderr and exit 2."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gateway.policy.kv import (
    GB,
    KVSpec,
    format_table,
    kv_spec_from_hf_config,
    kv_spec_from_params,
    parse_caps,
    parse_counts,
)
from gateway.tools.hfconfig import load_hf_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gateway kv``."""
    parser.add_argument("config", nargs="?", help="a Hugging Face config.json, or a model directory with one")
    parser.add_argument("--layers", type=int, help="number of layers (instead of a config.json)")
    parser.add_argument("--kv-heads", type=int, help="KV heads per layer (with --layers)")
    parser.add_argument("--head-dim", type=int, help="head dimension (with --layers)")
    parser.add_argument("--heads", type=int, help="attention (query) heads, to label MHA/GQA (with --layers)")
    parser.add_argument("--window", type=int, help="sliding window on every layer (with --layers)")
    parser.add_argument(
        "--kv-dtype",
        "--dtype",
        dest="kv_dtype",
        default="auto",
        help="fp32, fp16, bf16, fp8 (e4m3), fp8_e5m2, int8; auto = the checkpoint's torch_dtype (fp16 with --layers)",
    )
    parser.add_argument("--caps", default="256k,64k", help="context caps to compare (k = 1024)")
    parser.add_argument("--concurrency", default="1,8,32", help="concurrent sequences per column")
    parser.add_argument("--budget-gb", type=float, help="KV budget in GB (10^9): how many sequences fit")
    parser.add_argument(
        "--no-sliding-window",
        action="store_true",
        help="count sliding layers at full context (engines that allocate them so)",
    )


def _spec_from_args(args: argparse.Namespace) -> KVSpec:
    shape = [args.layers, args.kv_heads, args.head_dim]
    if args.config is not None:
        if any(v is not None for v in (*shape, args.heads, args.window)):
            raise ValueError("give a config.json or --layers/--kv-heads/--head-dim, not both")
        path = Path(args.config)
        if path.is_dir():
            name = path.resolve().name
        else:
            name = path.resolve().parent.name if path.name == "config.json" else path.stem
        return kv_spec_from_hf_config(
            load_hf_config(path), args.kv_dtype, sliding_window=not args.no_sliding_window, name=name
        )
    if None in shape:
        raise ValueError("give a config.json path, or all of --layers, --kv-heads and --head-dim")
    for flag, value in (
        ("--layers", args.layers),
        ("--kv-heads", args.kv_heads),
        ("--head-dim", args.head_dim),
        ("--heads", args.heads),
        ("--window", args.window),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1")
    return kv_spec_from_params(
        args.layers,
        args.kv_heads,
        args.head_dim,
        args.kv_dtype,
        attention_heads=args.heads,
        name="custom",
        sliding_window=None if args.no_sliding_window else args.window,
    )


def run(args: argparse.Namespace) -> int:
    """``gateway kv``: print the KV table; bad input -> one line on stderr and exit status 2."""
    try:
        caps = parse_caps(args.caps)
        concurrency = parse_counts(args.concurrency)
        budget = None
        if args.budget_gb is not None:
            if not (math.isfinite(args.budget_gb) and args.budget_gb * GB >= 1):
                raise ValueError(f"--budget-gb must be a positive number of GB, got {args.budget_gb}")
            budget = round(args.budget_gb * GB)
        spec = _spec_from_args(args)
        print(format_table(spec, caps, concurrency, budget_bytes=budget))
    except (OSError, ValueError) as e:
        print(f"gateway kv: error: {e}", file=sys.stderr)
        return 2
    return 0
