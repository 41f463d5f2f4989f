#!/usr/bin/env python3
"""Train the small test tokenizers committed under tests/data/tokenizer/.

Real checkpoint tokenizers cannot be downloaded here, so this script trains small byte-level BPE models with
PyPI `tokenizers` on a deterministic generated corpus, using the pre-tokenizer configurations and special tokens
of the real families (docs/tokenizer.md §pre-tokenizers, §glm-chat, §deepseek-chat):

  glm5         GLM-5: no normalizer, Sequence[Split(R, Isolated), ByteLevel], BPE ignore_merges, ByteLevel decoder,
               ByteLevel post-processor, the GLM added tokens of docs/tokenizer.md §glm-chat right after the vocab.
  deepseek_v3  DeepSeek-V3: Sequence([]) normalizer, Sequence[Split(A), Split(B), Split(C), ByteLevel],
               BOS/EOS/pad at ids 0-2, TemplateProcessing post-processor adding BOS, DeepSeek added tokens.
  kimi_k2      Kimi-K2 style: its tiktoken pattern (character-class intersection `&&`, \\p{Han}) + ByteLevel.
  bytefb       A Llama-style variant: NFKC + Replace normalizers, Digits(individual) + Split pre-tokenizers,
               BPE with byte_fallback and a fused unk token (some <0xNN> entries missing on purpose),
               ByteFallback + Fuse + Strip decoders, TemplateProcessing with BOS and EOS, and added tokens with
               lstrip / rstrip / single_word / normalized set.

Usage: build/venv/bin/python tools/train_test_tokenizer.py [--out tests/data/tokenizer]
Deterministic: the corpus comes from a seeded generator; training runs single-threaded.
"""
import argparse
import json
import os
import random

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,  # noqa: E402
                        processors, trainers)

GLM_R = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DS_A = r"\p{N}{1,3}"
DS_B = "[一-龥぀-ゟ゠-ヿ]+"
# As in DeepSeek-V3's tokenizer.json, some \r\n of C are literal CR / LF characters.
DS_C = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
KIMI = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# (content, special) in id order; docs/tokenizer.md §glm-chat.
GLM_ADDED = [
    ("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True), ("<sop>", True),
    ("<eop>", True), ("<|system|>", True), ("<|user|>", True), ("<|assistant|>", True), ("<|observation|>", True),
    ("<|begin_of_image|>", True), ("<|end_of_image|>", True), ("<|begin_of_video|>", True),
    ("<|end_of_video|>", True), ("<|begin_of_audio|>", True), ("<|end_of_audio|>", True),
    ("<|begin_of_transcription|>", True), ("<|end_of_transcription|>", True),
    ("<|code_prefix|>", False), ("<|code_middle|>", False), ("<|code_suffix|>", False),
    ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<arg_key>", False), ("</arg_key>", False),
    ("<arg_value>", False), ("</arg_value>", False), ("/nothink", False),
]
# Entries only reachable through ignore_merges (a direct vocab hit), in ByteLevel alphabet.
GLM_EXTRA_VOCAB = ["Ġinternationalization", "Ġtokenization", "ĠSupercalifragilistic", "Ġunbelievable",
                   "ĠÐŁÑĢÐ¸Ð²ÐµÑĤ"]

DS_BOS, DS_EOS, DS_PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
DS_ADDED = [
    ("<｜fim▁hole｜>", False), ("<｜fim▁begin｜>", False), ("<｜fim▁end｜>", False), ("<｜User｜>", False),
    ("<｜Assistant｜>", False), ("<|EOT|>", True), ("<｜tool▁calls▁begin｜>", False), ("<｜tool▁calls▁end｜>", False),
    ("<｜tool▁call▁begin｜>", False), ("<｜tool▁call▁end｜>", False), ("<｜tool▁outputs▁begin｜>", False),
    ("<｜tool▁outputs▁end｜>", False), ("<｜tool▁output▁begin｜>", False), ("<｜tool▁output▁end｜>", False),
    ("<｜tool▁sep｜>", False), ("<think>", False), ("</think>", False), ("<｜place▁holder▁no▁0｜>", True),
    ("<｜place▁holder▁no▁1｜>", True), ("<｜place▁holder▁no▁2｜>", True),
]

KIMI_ADDED = [
    ("[BOS]", True), ("[EOS]", True), ("<|im_end|>", True), ("<|im_user|>", True), ("<|im_assistant|>", True),
    ("<|im_system|>", True), ("<|im_middle|>", True), ("[UNK]", True), ("[PAD]", True),
    ("<think>", False), ("</think>", False), ("<|tool_calls_section_begin|>", True),
    ("<|tool_calls_section_end|>", True), ("<|tool_call_begin|>", True), ("<|tool_call_argument_begin|>", True),
    ("<|tool_call_end|>", True),
]

# ---------------------------------------------------------------------------------------------------------------
# Corpus: seeded combinations of sentences in several scripts, code and numbers.

EN = [
    "The quick brown fox jumps over the lazy dog.", "I'm sure it's fine, but we'll see what they've done.",
    "She said: \"Don't touch that!\" and he didn't.", "Tokenization is the first step of every language model.",
    "In 2024, the model was trained on 15 trillion tokens.", "Hello, world! How are you doing today?",
    "The inference engine reads the checkpoint exactly as it is stored.", "We measured 11.5% relative error.",
    "Mixture-of-experts layers route each token to a few experts.", "It costs $1,299.99 (excluding tax).",
    "Please e-mail support@example.com or visit https://example.org/docs?id=42.",
    "THE END. THAT'S ALL, FOLKS! YOU'RE WELCOME.", "internationalization and localization are hard",
    "A stitch in time saves nine; an apple a day keeps the doctor away.", "Call me at +1 (555) 123-4567.",
    "Numbers: 0 1 2 3 42 123 1234 12345 1000000 3.14159 2.71828 1e-5", "The year 1999 was followed by 2000.",
    "Attention is all you need, they said.", "Let's go to the park, shall we?", "He'd've known if you'd told him.",
]
ZH = ["你好，世界！今天天气很好。", "机器学习是人工智能的一个分支。", "我们在北京大学学习自然语言处理。",
      "这个模型有一千亿个参数。", "中文分词是一个经典问题。", "请把文件发送给我，谢谢！"]
JA = ["こんにちは、世界。", "東京は日本の首都です。", "コンピューター・サイエンスを勉強しています。",
      "ラーメンが大好きです！", "ひらがなとカタカナと漢字。"]
KO = ["안녕하세요, 세계!", "한국어는 아름다운 언어입니다.", "서울에서 만나요."]
OTHER = ["Привет, мир! Как дела?", "Съешь же ещё этих мягких французских булок.", "مرحبا بالعالم", "שלום עולם",
         "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก", "Γειά σου Κόσμε", "Ça va très bien, merci. Où est la gare?",
         "Müller fährt nach Köln über die Brücke.", "¿Dónde está la biblioteca? ¡Aquí!", "Zażółć gęślą jaźń.",
         "Tiếng Việt có dấu.", "naïve café résumé façade coöperate"]
CODE = [
    "def main(argv):\n    for i in range(10):\n        print(f\"{i}: {argv[i]!r}\")\n    return 0\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() == 3 ? 0 : 1;\n}\n",
    "{\"name\": \"latent\", \"version\": \"0.1.0\", \"tags\": [\"mla\", \"moe\"], \"ok\": true, \"n\": null}",
    "<html><body><div class=\"main\">Hello &amp; welcome</div></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "    if (x != nullptr && x->next) { x = x->next; }\r\n",
    "# Title\n\n- item one\n- item two\n\n```python\nx = [1, 2, 3]\n```\n",
    "const add = (a, b) => a + b; // arrow function\n", "fn main() { println!(\"{}\", 1 + 2); }",
    "$ ls -la /usr/local/bin | grep -v '^d'", "x_1 = y__2 + self._private_attr * 3 ** 2",
]
EMOJI = ["👍", "🎉 party!", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵", "😀😃😄", "❤️", "1️⃣ one"]


def make_corpus(seed: int, n_lines: int) -> list:
    rng = random.Random(seed)
    pools = [(EN, 10), (ZH, 3), (JA, 2), (KO, 1), (OTHER, 2), (CODE, 3), (EMOJI, 1)]
    weighted = [p for p, w in pools for _ in range(w)]
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(1, 4)):
            parts.append(rng.choice(rng.choice(weighted)))
        if rng.random() < 0.3:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        sep = rng.choice([" ", " ", "\n", "  ", "\t", "\n\n"])
        lines.append(sep.join(parts))
    return lines


# ---------------------------------------------------------------------------------------------------------------

def added(content, special, **kw):
    kw.setdefault("normalized", False)
    return AddedToken(content, special=special, **kw)


def train_bpe(tok, corpus, vocab_size, special_tokens=(), **trainer_kw):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(special_tokens), **trainer_kw)
    tok.train_from_iterator(corpus, trainer)
    return tok


def edit_model(tok, fn):
    """Round-trip through JSON to change model fields the Python API does not expose."""
    d = json.loads(tok.to_str())
    fn(d)
    return Tokenizer.from_str(json.dumps(d, ensure_ascii=False))


def write(out_dir, name, tok, config, merges_as_strings=False):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path, pretty=False)
    if merges_as_strings:
        # DeepSeek-V3's file writes merges as "a b" strings (the older format): keep one family on it.
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    size = os.path.getsize(os.path.join(d, "tokenizer.json"))
    print(f"{name}: vocab {tok.get_vocab_size(with_added_tokens=False)} + added "
          f"{tok.get_vocab_size(with_added_tokens=True) - tok.get_vocab_size(with_added_tokens=False)}, "
          f"{size / 1024:.0f} KiB")


def build_glm5(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM_R), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    train_bpe(tok, corpus, 3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def fix(d):
        d["model"]["ignore_merges"] = True
        vocab = d["model"]["vocab"]
        for t in GLM_EXTRA_VOCAB:
            if t not in vocab:
                vocab[t] = len(vocab)
    tok = edit_model(tok, fix)
    for content, special in GLM_ADDED:
        tok.add_tokens([added(content, special)])
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
           "clean_up_tokenization_spaces": False, "do_lower_case": False, "model_max_length": 202752,
           "padding_side": "left", "remove_space": False}
    return tok, cfg


def build_deepseek(corpus):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(DS_A), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(DS_B), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(DS_C), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train_bpe(tok, corpus, 3000, special_tokens=[DS_BOS, DS_EOS, DS_PAD],
              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    for content, special in DS_ADDED:
        tok.add_tokens([added(content, special)])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{DS_BOS}:0 $A:0", pair=f"{DS_BOS}:0 $A:0 {DS_BOS}:1 $B:1",
                                      special_tokens=[(DS_BOS, 0)])])
    cfg = {"add_bos_token": True, "add_eos_token": False,
           "bos_token": {"__type": "AddedToken", "content": DS_BOS, "lstrip": False, "normalized": True,
                         "rstrip": False, "single_word": False},
           "eos_token": {"__type": "AddedToken", "content": DS_EOS, "lstrip": False, "normalized": True,
                         "rstrip": False, "single_word": False},
           "pad_token": {"__type": "AddedToken", "content": DS_EOS, "lstrip": False, "normalized": True,
                         "rstrip": False, "single_word": False},
           "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": 131072,
           "sp_model_kwargs": {}, "unk_token": None, "tokenizer_class": "LlamaTokenizerFast"}
    return tok, cfg


def build_kimi(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(KIMI), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train_bpe(tok, corpus, 2500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    for content, special in KIMI_ADDED:
        tok.add_tokens([added(content, special)])
    cfg = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
           "pad_token": "[PAD]", "unk_token": "[UNK]", "clean_up_tokenization_spaces": False}
    return tok, cfg


def build_bytefb(corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("``", "\"")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r" ?[^\s\p{N}]+|\s+"), behavior="isolated", invert=False)])
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # The 120 most frequent characters, ties by code point (the trainer's own limit_alphabet breaks ties at random).
    counts = {}
    for line in corpus:
        for ch in line:
            counts[ch] = counts.get(ch, 0) + 1
    alphabet = sorted(counts, key=lambda c: (-counts[c], ord(c)))[:120]
    train_bpe(tok, corpus, 1500, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet,
              limit_alphabet=len(alphabet))

    missing = {0xF0, 0xC0, 0xC1, 0xFF}  # 4-byte sequences have no byte token: they become the fused unk

    def fix(d):
        d["model"]["byte_fallback"] = True
        vocab = d["model"]["vocab"]
        for b in range(256):
            if b not in missing:
                vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = edit_model(tok, fix)
    tok.add_tokens([
        added("<mask>", True, lstrip=True),
        added("[SEP]", True, rstrip=True),
        added("<pad>", True, lstrip=True, rstrip=True),
        added("hello_world", False, single_word=True, normalized=True),
        added("[lstrip-norm]", False, lstrip=True, normalized=True),
        added("ＡＢＣ", False, normalized=True),   # matched as its NFKC form "ABC" in the normalized text
        added("<raw①>", False, normalized=False),  # matched only before normalization
        added("<<", False),
        added("<<<", False),
    ])
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0 </s>:0", pair="<s>:0 $A:0 </s>:0 $B:1",
                                                       special_tokens=[("<s>", 1), ("</s>", 2)])
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "clean_up_tokenization_spaces": False}
    return tok, cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "tokenizer"))
    args = ap.parse_args()
    corpus = make_corpus(1234, 6000)
    print(f"tokenizers {tokenizers.__version__}; corpus {sum(len(x) for x in corpus)} chars")
    for name, build in [("glm5", build_glm5), ("deepseek_v3", build_deepseek), ("kimi_k2", build_kimi),
                        ("bytefb", build_bytefb)]:
        tok, cfg = build(corpus)
        write(args.out, name, tok, cfg, merges_as_strings=(name == "deepseek_v3"))


if __name__ == "__main__":
    main()
