"""Write a tiny random-weight Llama checkpoint (HF format) for running a real vLLM server in tests.

Usage: python make_tiny_hf.py OUT_DIR   (needs torch, safetensors, tokenizers: run it with the vLLM
venv's python)

Llama, 2 layers, hidden 128, ff 256, 4 heads / 2 KV heads (head_dim 32: vLLM's CPU attention needs
head_dim in {32, 64, 80, ...}), vocab 512, bf16. The tokenizer is a byte-level BPE with the same
vocabulary and merges as the tiny GGUF (tiny_vocab.py), and tokenizer_config.json carries the ChatML
chat_template inline. Files are written directly (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, ...) rather than via transformers' save_pretrained, whose output format changes
between versions. Deterministic.

As in the GGUF, hidden dim 0 is a bias channel that gives banned tokens (non-printable, non-ASCII,
special tokens, EOS) a logit far below -100, so output is printable ASCII gibberish and generation
always runs to max_tokens.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_vocab import CHATML_TEMPLATE, SPECIAL_TOKENS, banned_token_mask, build_vocab

SEED = 4321
N_LAYER = 2
HIDDEN = 128
FF = 256
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = HIDDEN // N_HEAD
MAX_POS = 4096
BIAS_VALUE = 4.0
BANNED_WEIGHT = -40.0


def build_weights(n_vocab: int, banned: list[bool]) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(SEED)

    def rand(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    emb = rand(n_vocab, HIDDEN, std=1.0)
    emb[:, 0] = BIAS_VALUE
    w["model.embed_tokens.weight"] = emb
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        w[p + "self_attn.q_proj.weight"] = rand(N_HEAD * HEAD_DIM, HIDDEN, std=0.1)
        w[p + "self_attn.k_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, HIDDEN, std=0.1)
        w[p + "self_attn.v_proj.weight"] = rand(N_HEAD_KV * HEAD_DIM, HIDDEN, std=0.1)
        o = rand(HIDDEN, N_HEAD * HEAD_DIM, std=0.05)
        o[0, :] = 0.0  # never write the bias channel
        w[p + "self_attn.o_proj.weight"] = o
        w[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        w[p + "mlp.gate_proj.weight"] = rand(FF, HIDDEN, std=0.1)
        w[p + "mlp.up_proj.weight"] = rand(FF, HIDDEN, std=0.1)
        down = rand(HIDDEN, FF, std=0.05)
        down[0, :] = 0.0
        w[p + "mlp.down_proj.weight"] = down
    w["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    head = rand(n_vocab, HIDDEN, std=0.15)
    head[:, 0] = np.where(np.array(banned), BANNED_WEIGHT, 0.0).astype(np.float32)
    w["lm_head.weight"] = head
    return {k: torch.from_numpy(v).to(torch.bfloat16).contiguous() for k, v in w.items()}


def build_tokenizer(tokens: list[str], merges: list[tuple[str, str]]) -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(tokens) if tok not in SPECIAL_TOKENS}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    for s in SPECIAL_TOKENS:
        assert tok.token_to_id(s) == tokens.index(s), s
    return tok


def write_model(out: Path) -> None:
    tokens, merges = build_vocab()
    banned = banned_token_mask(tokens)
    eot_id = tokens.index("<|endoftext|>")
    im_end_id = tokens.index("<|im_end|>")

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(tokens),
        "hidden_size": HIDDEN,
        "intermediate_size": FF,
        "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD,
        "num_key_value_heads": N_HEAD_KV,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": eot_id,
        "eos_token_id": im_end_id,
        "pad_token_id": eot_id,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
    }
    added = {
        str(tokens.index(s)): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POS,
        "added_tokens_decoder": added,
        "chat_template": CHATML_TEMPLATE,
    }
    special_map = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    generation_config = {"bos_token_id": eot_id, "eos_token_id": im_end_id, "pad_token_id": eot_id}

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    build_tokenizer(tokens, merges).save(str(out / "tokenizer.json"))
    save_file(build_weights(len(tokens), banned), str(out / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_hf.py OUT_DIR")
    out = Path(sys.argv[1])
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_model(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
