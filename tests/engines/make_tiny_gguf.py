"""Write a tiny random-weight llama GGUF for running a real llama-server in tests.

Usage: python make_tiny_gguf.py OUT.gguf [--agent]   (needs the `gguf` and `numpy` packages)

Llama architecture, 2 layers, n_embd 128, ff 256, 4 heads / 2 KV heads, context_length 4096, f32,
gpt2 byte-level BPE tokenizer (see tiny_vocab.py), ChatML chat template. Deterministic: the same
script always writes the same bytes.

The output is gibberish by design. Hidden dimension 0 is a bias channel: every token embedding holds
a constant there and no layer writes to it, so after the final RMSNorm it is a large, nearly constant
positive value. The output layer's column 0 is -40 for banned tokens (non-printable, non-ASCII,
special tokens, EOS) and 0 otherwise, which puts banned logits far below -100. So llama-server never
emits invalid UTF-8 (which it answers with HTTP 500) and never stops early: generation runs to
max_tokens.

``--agent`` writes the model the coding-agent tests run (Claude Code, Codex CLI): a 65,536-token
window, because an agent's first request carries its whole tool list (tens of thousands of tokens in
this small vocabulary), and an end-of-turn token (<|im_end|>) that is not banned but unlikely
(``AGENT_EOS_WEIGHT``), so that a turn ends by itself after some tens of tokens whatever
``max_tokens`` the agent asks for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_vocab import CHATML_TEMPLATE, SPECIAL_TOKENS, banned_token_mask, build_vocab

SEED = 1234
N_LAYER = 2
N_EMBD = 128
N_FF = 256
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
CTX = 4096
AGENT_CTX = 65536
AGENT_EOS_WEIGHT = 0.2  # output.weight[<|im_end|>, 0] for --agent: a turn of some tens of tokens
BIAS_VALUE = 4.0  # the constant held by hidden dim 0
BANNED_WEIGHT = -40.0  # output.weight[banned, 0]


def build_weights(n_vocab: int, banned: list[bool], eos: int | None = None) -> dict[str, np.ndarray]:
    """Random llama weights, numpy shapes (out_features, in_features), with the bias channel."""
    rng = np.random.default_rng(SEED)

    def rand(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    emb = rand(n_vocab, N_EMBD, std=1.0)
    emb[:, 0] = BIAS_VALUE
    w["token_embd.weight"] = emb
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        w[p + "attn_q.weight"] = rand(N_EMBD, N_EMBD, std=0.1)
        w[p + "attn_k.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.1)
        w[p + "attn_v.weight"] = rand(N_HEAD_KV * HEAD_DIM, N_EMBD, std=0.1)
        attn_out = rand(N_EMBD, N_EMBD, std=0.05)
        attn_out[0, :] = 0.0  # never write the bias channel
        w[p + "attn_output.weight"] = attn_out
        w[p + "ffn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        w[p + "ffn_gate.weight"] = rand(N_FF, N_EMBD, std=0.1)
        w[p + "ffn_up.weight"] = rand(N_FF, N_EMBD, std=0.1)
        down = rand(N_EMBD, N_FF, std=0.05)
        down[0, :] = 0.0
        w[p + "ffn_down.weight"] = down
    w["output_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
    out = rand(n_vocab, N_EMBD, std=0.15)
    out[:, 0] = np.where(np.array(banned), BANNED_WEIGHT, 0.0).astype(np.float32)
    if eos is not None:
        out[eos, 0] = AGENT_EOS_WEIGHT
    w["output.weight"] = out
    return w


def write_gguf(path: Path, agent: bool = False) -> None:
    tokens, merges = build_vocab()
    banned = banned_token_mask(tokens)
    token_types = [gguf.TokenType.CONTROL if tok in SPECIAL_TOKENS else gguf.TokenType.NORMAL for tok in tokens]
    eot_id = tokens.index("<|endoftext|>")
    im_end_id = tokens.index("<|im_end|>")

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_context_length(AGENT_CTX if agent else CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in token_types])
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    writer.add_bos_token_id(eot_id)
    writer.add_eos_token_id(im_end_id)
    writer.add_eot_token_id(im_end_id)
    writer.add_pad_token_id(eot_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    for name, arr in build_weights(len(tokens), banned, im_end_id if agent else None).items():
        writer.add_tensor(name, arr)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    args = sys.argv[1:]
    agent = "--agent" in args
    paths = [a for a in args if a != "--agent"]
    if len(paths) != 1:
        sys.exit("usage: make_tiny_gguf.py OUT.gguf [--agent]")
    out = Path(paths[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    write_gguf(tmp, agent)
    tmp.replace(out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
