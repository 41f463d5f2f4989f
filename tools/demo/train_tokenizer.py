#!/usr/bin/env python3
"""Trains the latent-demo byte-level BPE tokenizer (GLM-5 pre-tokenizer configuration and added tokens).

usage: train_tokenizer.py CORPUS_DIR OUT_DIR [--vocab 4096]
Writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json.
"""
import argparse
import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# GLM-5 split regex (docs/tokenizer.md §pre-tokenizers).
GLM_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# (content, special) in GLM-5 order (docs/tokenizer.md §glm-chat; multimodal and FIM tokens omitted).
ADDED = [("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True), ("<sop>", True),
         ("<eop>", True), ("<|system|>", True), ("<|user|>", True), ("<|assistant|>", True),
         ("<|observation|>", True), ("<think>", False), ("</think>", False), ("<tool_call>", False),
         ("</tool_call>", False), ("<tool_response>", False), ("</tool_response>", False), ("<arg_key>", False),
         ("</arg_key>", False), ("<arg_value>", False), ("</arg_value>", False), ("/nothink", False)]


def texts(corpus_dir):
    with open(os.path.join(corpus_dir, "train.jsonl")) as f:
        for line in f:
            for m in json.loads(line)["messages"]:
                yield m["content"]
                if m.get("reasoning_content"):
                    yield m["reasoning_content"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts(args.corpus_dir), trainer=trainer)
    n_base = tok.get_vocab_size()
    for content, special in ADDED:
        at = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
    os.makedirs(args.out_dir, exist_ok=True)
    tok.save(os.path.join(args.out_dir, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "remove_space": False,
        "padding_side": "left",
    }
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    ids = {c: tok.token_to_id(c) for c, _ in ADDED}
    print(f"base vocab {n_base}, total {tok.get_vocab_size()}; added ids {min(ids.values())}..{max(ids.values())}")


if __name__ == "__main__":
    main()
