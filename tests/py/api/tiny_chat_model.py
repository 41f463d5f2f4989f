"""A tiny GLM-5-style checkpoint with a real tokenizer, built for the API tests (no torch needed).

The weights are random except for a planted "bigram" behaviour: attention and MLP outputs are near zero, so the
final hidden state is (almost) the current token's embedding, and lm_head rows are set so that chosen tokens are
followed by chosen tokens. That makes a random model emit, deterministically:

  <think>   -> "Please check every token" </think>          (reasoning, when thinking is on)
  </think>  -> <tool_call>example<arg_key>latent</arg_key><arg_value>Numbers</arg_value></tool_call> <|observation|>
  </think>  -> (2nd choice, taken when <tool_call> is banned by logit_bias) "Hello world, welcome!" <|user|>

Everything else is random but deterministic. Files: config.json, model.safetensors, tokenizer.json +
tokenizer_config.json (tests/data/tokenizer/glm5, a GLM-5-layout test tokenizer), chat_template.jinja (GLM-5 style),
generation_config.json (eos = <|endoftext|>, <|user|>, <|observation|>).
"""
import json
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER_DIR = ROOT / "tests" / "data" / "tokenizer" / "glm5"
TEMPLATE = Path(__file__).resolve().parent / "glm5_chat_template.jinja"

# Texts whose tokens are all distinct in the test tokenizer (each token has one planted successor).
REASONING = "Please check every token"
CONTENT = "Hello world, welcome!"
TOOL_NAME, ARG_KEY, ARG_VALUE = "example", "latent", "Numbers"

D, L, H, DQ, DC, DN, DR, DV, E, IM, I = 256, 2, 4, 48, 32, 32, 16, 24, 4, 32, 128
NI, DI = 4, 32
MAX_POS = 1024


def available():
    """(ok, reason)"""
    try:
        import safetensors.numpy  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:
        return False, f"python package missing: {e.name}"
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        return False, f"test tokenizer missing: {TOKENIZER_DIR / 'tokenizer.json'}"
    if not TEMPLATE.exists():
        return False, f"chat template missing: {TEMPLATE}"
    return True, ""


class Vocab:
    def __init__(self):
        import tokenizers
        self.tok = tokenizers.Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))

    def id(self, token):
        i = self.tok.token_to_id(token)
        assert i is not None, token
        return i

    def ids(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    @property
    def size(self):
        return self.tok.get_vocab_size(with_added_tokens=True)


def chains(v):
    think, end_think = v.id("<think>"), v.id("</think>")
    tool = ([v.id("<tool_call>")] + v.ids(TOOL_NAME) + [v.id("<arg_key>")] + v.ids(ARG_KEY) + [v.id("</arg_key>"),
            v.id("<arg_value>")] + v.ids(ARG_VALUE) + [v.id("</arg_value>"), v.id("</tool_call>"), v.id("<|observation|>")])
    reasoning = [think] + v.ids(REASONING) + [end_think]
    content = v.ids(CONTENT) + [v.id("<|user|>")]
    return reasoning, [end_think] + tool, content


def build(out_dir, seed=1234):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    v = Vocab()
    V = (v.size + 15) // 16 * 16  # padded embedding, as real checkpoints have
    rng = np.random.default_rng(seed)
    f32 = np.float32

    def normal(shape, sd, mean=0.0):
        return (mean + sd * rng.standard_normal(shape)).astype(f32)

    t = {}
    emb = normal((V, D), 1.0)
    t["model.embed_tokens.weight"] = emb
    t["model.norm.weight"] = np.ones(D, f32)
    lm = normal((V, D), 1.2 / np.sqrt(D))  # random logits ~ N(0, 1.2^2) on a unit-RMS hidden state
    # Planted transitions: logit(b | a) ~ 16 * w for each (a, b, w).
    reasoning, tool, content = chains(v)
    edges = {}
    for chain, w in ((reasoning, 1.0), (tool, 1.0), (content, 1.0)):
        for a, b in zip(chain, chain[1:]):
            assert edges.get(a, (b,))[0] == b, f"token {a} would need two successors"
            edges[a] = (b, w)
    second = (v.id("</think>"), content[0], 0.85)  # </think> -> content when <tool_call> is banned
    unit = emb / np.sqrt((emb ** 2).mean(axis=1, keepdims=True))
    for a, (b, w) in edges.items():
        lm[b] += w * unit[a] / np.sqrt(D)
    lm[second[1]] += second[2] * unit[second[0]] / np.sqrt(D)
    t["lm_head.weight"] = lm
    small = 0.02  # attention / MLP outputs: a small context-dependent perturbation of the embedding
    for layer in range(L):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = np.ones(D, f32)
        t[p + "post_attention_layernorm.weight"] = np.ones(D, f32)
        t[a + "q_a_proj.weight"] = normal((DQ, D), 0.1)
        t[a + "q_a_layernorm.weight"] = np.ones(DQ, f32)
        t[a + "q_b_proj.weight"] = normal((H * (DN + DR), DQ), 0.1)
        t[a + "kv_a_proj_with_mqa.weight"] = normal((DC + DR, D), 0.1)
        t[a + "kv_a_layernorm.weight"] = np.ones(DC, f32)
        t[a + "kv_b_proj.weight"] = normal((H * (DN + DV), DC), 0.1)
        t[a + "o_proj.weight"] = normal((D, H * DV), small)
        ip = a + "indexer."
        t[ip + "wq_b.weight"] = normal((NI * DI, DQ), 0.1)
        t[ip + "wk.weight"] = normal((DI, D), 0.1)
        t[ip + "weights_proj.weight"] = normal((NI, D), 0.1)
        t[ip + "k_norm.weight"] = np.ones(DI, f32)
        t[ip + "k_norm.bias"] = np.zeros(DI, f32)
        m = p + "mlp."

        def mlp(q, inter):
            t[q + "gate_proj.weight"] = normal((inter, D), 0.1)
            t[q + "up_proj.weight"] = normal((inter, D), 0.1)
            t[q + "down_proj.weight"] = normal((D, inter), small)

        if layer == 0:
            mlp(m, I)
        else:
            t[m + "gate.weight"] = normal((E, D), 0.1)
            t[m + "gate.e_score_correction_bias"] = normal((E,), 0.05)
            for e in range(E):
                mlp(m + f"experts.{e}.", IM)
            mlp(m + "shared_experts.", IM)
    from safetensors.numpy import save_file
    save_file(t, str(out / "model.safetensors"))
    cfg = {
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
        "vocab_size": V, "hidden_size": D, "intermediate_size": I, "moe_intermediate_size": IM,
        "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": H, "q_lora_rank": DQ,
        "kv_lora_rank": DC, "qk_nope_head_dim": DN, "qk_rope_head_dim": DR, "v_head_dim": DV,
        "n_routed_experts": E, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
        "index_n_heads": NI, "index_head_dim": DI, "index_topk": 64, "indexer_types": ["full"] * L,
        "rms_norm_eps": 1e-5, "max_position_embeddings": MAX_POS, "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "eos_token_id": [v.id("<|endoftext|>"), v.id("<|user|>"), v.id("<|observation|>")],
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({
        "eos_token_id": cfg["eos_token_id"], "pad_token_id": v.id("<|endoftext|>")}))
    shutil.copy(TOKENIZER_DIR / "tokenizer.json", out / "tokenizer.json")
    shutil.copy(TOKENIZER_DIR / "tokenizer_config.json", out / "tokenizer_config.json")
    shutil.copy(TEMPLATE, out / "chat_template.jinja")
    return {"vocab": V, "reasoning": REASONING, "content": CONTENT, "tool_name": TOOL_NAME,
            "arguments": json.dumps({ARG_KEY: ARG_VALUE}), "tool_call_id": v.id("<tool_call>"),
            "think_id": v.id("<think>"), "eos": cfg["eos_token_id"], "max_pos": MAX_POS}


if __name__ == "__main__":
    import sys
    print(build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/latent-tiny-chat"))
