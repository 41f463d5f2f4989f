#!/usr/bin/env python3
"""Conformance fixtures for the C++ tokenizer, produced with PyPI `tokenizers` (docs/tokenizer.md §conformance).

For every tokenizer directory under tests/data/tokenizer/ (made by tools/train_test_tokenizer.py) this writes
  encode.jsonl  first line {"meta": ...}; then one object per hard string:
                {"text", "ids" (add_special_tokens=False), "ids_special" (True; absent when equal to ids),
                 "ids_split" (add_special_tokens=False with encode_special_tokens=True; absent when equal to ids)}
  decode.jsonl  first line {"meta": ...}; then {"ids", "text" (skip_special_tokens=False), "text_skip" (True)}
and tests/data/tokenizer/variants.jsonl: the same tokenizers with one component swapped (pre-tokenizers,
normalizers and decoders the families above do not use), a header line per variant then its cases.
All JSON is ASCII-escaped. The hard-string corpus is fixed (a seeded generator for the random part).

With --unicode-tables it instead regenerates src/tokenizer/unicode_tables.cpp: the character classes exactly as
the reference build sees them (Oniguruma's \\p{..}, \\s, \\w, \\d inside `tokenizers`, and the Rust-side classes
used by the Whitespace / Digits / Punctuation pre-tokenizers and by added-token single_word), so that the C++
regexes do not depend on the Unicode version of the system PCRE2.

Usage: build/venv/bin/python tools/gen_tokenizer_fixtures.py [--unicode-tables]
"""
import argparse
import hashlib
import json
import os
import random
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
NAMES = ["glm5", "deepseek_v3", "kimi_k2", "bytefb"]

# ---------------------------------------------------------------------------------------------------------------
# Hard strings


def hard_strings():
    s = []
    add = s.append
    # Empty and whitespace
    for x in ["", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r", "\r\n", "\r\n\r\n", "\n\r", " \n",
              "\n ", " \n ", "  \n  ", "\t\n\t", " \t \t ", "a  b", "a   b", "a \n b", "a\n\nb", "a\r\nb",
              "  leading", "trailing  ", "  both  ", "a\tb\tc", "line1\nline2\n", "x \t\n\r\x0b\x0c y",
              "word\n\n\n\nword", "   \n\n   x", "end with newline\n", "\n\tindented", "a\u00a0b", "\u00a0",
              "a\u3000b", "\u3000\u3000", "a\u0085b", "a\u2028b\u2029c", "a\u200bb", "\u200b", "a\ufeffb", "\ufeff",
              "a\x1cb\x1dc\x1ed\x1ff", "\x1c\x1d\x1e\x1f", "a\u2009b\u202fc\u205fd", "a\u1680b", "x\u180ey",
              "a \u00a0 b", " \u3000 ", "tab\t \tspace", "  \t\n  \t\n"]:
        add(x)
    # Contractions in all cases, curly apostrophes, long s, Kelvin sign
    for x in ["I'm", "I'M", "i'm", "you're", "YOU'RE", "You'Re", "we've", "WE'VE", "it's", "IT'S", "It'S",
              "don't", "DON'T", "Don'T", "he'll", "HE'LL", "He'Ll", "she'd", "SHE'D", "they'd've", "y'all",
              "it\u2019s", "IT\u2019S", "don\u2019t", "'s", "'S", "'\u017f", "'\u017ftart", "x'\u017f", "\u212a",
              "\u212aelvin", "'\u212a", "'ll'll'll", "''s", "' s", "'s's's", "rock'n'roll", "O'Neil's",
              "'twas", "ma'am", "'re", "'ve", "'m", "'d", "'t", "'LL", "'Re", "l'\u00e9t\u00e9", "can't-won't"]:
        add(x)
    # Numbers
    for x in ["1", "12", "123", "1234", "12345", "123456", "1234567", "0", "007", "3.14159", "1,000,000",
              "1 000 000", "-42", "+7", "1e10", "0x1F", "v1.2.3", "2024-01-01", "12:30:45", "$100", "100%",
              "abc123def", "123abc", "a1b2c3", "\u0661\u0662\u0663\u0664\u0665", "\u06f1\u06f2\u06f3\u06f4",
              "\uff11\uff12\uff13\uff14", "\u00b2\u00bd\u2166\u3007", "x\u00b2+y\u00b2", "\u2460\u2461\u2462",
              "\u0967\u0968\u0969", "\u0e51\u0e52\u0e53", "\U0001d7ce\U0001d7cf", "99999999999999999999",
              "1.2.3.4.5", "3\u00bd", "\u2153\u2154", "\u216b", "IV VI XII"]:
        add(x)
    # Scripts
    for x in ["\u4f60\u597d\u4e16\u754c", "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u4e2d\u6587\u5206\u8bcd",
              "\u9fa5\u9fa6\u9fa5", "\u3400\u3401\u4db5", "\U00020000\U0002a6d6", "\u6f22\u5b57\u304b\u306a",
              "\u3053\u3093\u306b\u3061\u306f", "\u30b3\u30f3\u30d4\u30e5\u30fc\u30bf\u30fc",
              "\u30b3\u30f3\u30d4\u30e5\u30fc\u30bf\u30fc\u30fb\u30b5\u30a4\u30a8\u30f3\u30b9", "\u30fc\u30fc\u30fc",
              "\uff76\uff80\uff76\uff85", "\uc548\ub155\ud558\uc138\uc694", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
              "\u1100\u1161\u11a8", "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0939\u093f\u0928\u094d\u0926\u0940",
              "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
              "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd",
              "\u041f\u0440\u0438\u0432\u0435\u0442", "\u0393\u03b5\u03b9\u03ac", "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
              "\u0531\u0562\u0563", "\u1200\u1201\u1202", "\u0dc3\u0dd2\u0d82\u0dc4\u0dbd", "\u0f56\u0f7c\u0f51",
              "Vi\u1ec7t Nam", "Stra\u00dfe", "STRASSE", "\u0130stanbul \u0131", "\u01c5\u01c8\u01cb",
              "caf\u00e9", "cafe\u0301", "e\u0301\u0301\u0301", "\u00e9", "e\u0301", "\u1e9b\u0323", "\u0041\u030a\u212b",
              "\ufb01\ufb02", "\u2126\u03a9", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319a\u0317l\u0330go",
              "\u0300start", "mid\u0300dle", "x\u20dd", "\u0e01\u0e34\u0e4a", "\u1780\u17d2\u1798\u17c2\u179a"]:
        add(x)
    # Emoji
    for x in ["\U0001f44d", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
              "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5", "1\ufe0f\u20e3",
              "#\ufe0f\u20e3", "\u2764\ufe0f", "\u2764", "\U0001f600\U0001f603\U0001f604", "hi\U0001f600there",
              "\U0001f9d1\U0001f3ff\u200d\U0001f91d\u200d\U0001f9d1\U0001f3fb", "\U0001faf8\U0001fae8\U0001fa8f",
              "\U0001fadc\U0001fadf", "\U0001fac8", "\U000e0067\U000e0062", "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",
              "\ue000\uf8ff", "\U000f0000\U0010fffd", "\u0378\u0379", "\U0001fbff", "\U000e0001", "\u2028\U0001f600",
              "\u00a9\u00ae\u2122", "\u2603\u2614", "\U0001d400\U0001d401", "a\U0001f600", "\U0001f600 \U0001f600",
              "\u1c89\u1c8a", "\U00011f00\U00011f01", "\u31e4\u31e5", "\U0002ebf0", "\U0001cc00 \U0001cc01"]:
        add(x)
    # Code and markup
    for x in ["def f(x):\n    return x + 1\n", "if (a && b || !c) { return; }", "x = [1, 2, 3]\nprint(x[0])",
              "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}", "#include <stdio.h>\nint main(void);",
              "{\"key\": \"value\", \"n\": 1.5e-3, \"arr\": [true, false, null]}", "<div class=\"x\">&nbsp;</div>",
              "SELECT * FROM t WHERE a='b';", "    four spaces", "\t\ttwo tabs", "x_y_z __init__ _private",
              "a->b::c<d>", "foo.bar().baz()", "path/to/file.txt", "C:\\Users\\name\\file", "https://a.b/c?d=e&f=g#h",
              "user@example.com", "# Heading\n\n**bold** _it_ `code`", "```python\nprint('hi')\n```",
              "- [ ] todo\n- [x] done", "| a | b |\n|---|---|", "$ echo $HOME && ls -la", "i++; --j; k **= 2;",
              "λx.x", "\u2200x\u2208S: f(x)\u2264g(x)", "a != b == c <= d >= e", "...", "!!!???", "---",
              "(((nested)))", "\"quoted\" 'single' `back`", "@decorator\ndef g(): pass", "$$\\frac{a}{b}$$",
              "<!-- comment -->", "x=1;y=2;z=3", "\\n\\t\\r", "%d %s %%", "##", "a.b.c", ".com", "_id", "'s"]:
        add(x)
    # Special-token look-alikes and exact specials
    for x in ["<|user|>", "<|assistant|>", "hi<|user|>there", "hi <|user|> there", "<|user|><|user|>",
              "<|user|> <|assistant|>", "[gMASK]<sop>", "[gMASK]<sop><|user|>hi<|assistant|><think>",
              "<think>reasoning</think>answer", "<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
              "/nothink", "please /nothink now", "/nothinking", "<|User|>", "<|user |>", "< |user|>", "<|user|",
              "<|endoftext|>", "<|endoftext", "endoftext|>", "<|endoftext|><|endoftext|>", "[MASK][MASK]",
              "<\uff5cUser\uff5c>", "<\uff5cUser|>", "<|User\uff5c>", "<\uff5cAssistant\uff5c>",
              "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>Hello",
              "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cbegin of sentence\uff5c>",
              "<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>get<\uff5ctool\u2581sep\uff5c>{}",
              "<|EOT|>", "<|im_user|>", "<|im_end|>[EOS]", "[BOS]", "[BOS][EOS]", "<think>\n", "</think>\n\n",
              "<thin>", "<think", "think>", "<<think>>", "<mask>", "  <mask>", "a <mask> b", "[SEP]  x", "[SEP]",
              "x  <pad>  y", "hello_world", "a hello_world b", "xhello_world", "hello_worldx", "hello_world_",
              "(hello_world)", "\u00e9hello_world", "\uff21\uff22\uff23", "ABC", "xABCx", "<raw\u2460>", "<raw1>",
              "<<", "<<<", "<<<<", "<<<<<", " [lstrip-norm]", "a   [lstrip-norm]", "<s>", "</s>", "<unk>",
              "<0x41>", "<|code_prefix|>x<|code_suffix|>y<|code_middle|>", "<|begin_of_image|><|end_of_image|>",
              "<|observation|><tool_response>ok</tool_response>", "<sop><eop>", "[sMASK]x[gMASK]",
              "text<|system|>", "<|system|>\n", " <|user|> ", "\n<|user|>\n"]:
        add(x)
    # Prose
    for x in ["The quick brown fox jumps over the lazy dog.", "Hello, world!", "Hello world", "hello",
              "HELLO WORLD", "internationalization", " internationalization", " tokenization",
              " Supercalifragilistic", " unbelievable", " \u041f\u0440\u0438\u0432\u0435\u0442",
              "It was the best of times, it was the worst of times.",
              "Mixed: English, \u4e2d\u6587, \u65e5\u672c\u8a9e, \ud55c\uad6d\uc5b4, \u0627\u0644\u0639\u0631\u0628\u064a\u0629.",
              "Don't panic!! 42 is the answer.\n\nReally?", "e.g. i.e. etc. Mr. Dr. St.", "the the the the",
              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abababababababab", "\u4e00\u4e00\u4e00\u4e00"]:
        add(x)
    # Controls
    for x in ["\x00", "a\x00b", "\x01\x02\x03", "\x07\x08", "\x7f", "\x80\x81\x9f", "\u00ad", "soft\u00adhyphen",
              "\u200e\u200f", "\u202a\u202e", "\u2060\u2061", "\ufff9\ufffa\ufffb", "\ufffd", "a\ufffdb",
              "\ufffc", "\U0001d173\U0001d17a"]:
        add(x)
    # Long strings
    add("a" * 10000)
    add(" " * 10000)
    add("\n" * 3000 + "x")
    add("\u4e2d" * 1000)
    add(("word " * 2000).strip())
    add("1234567890" * 300)
    add("\U0001f600" * 300)
    # Random mixed strings (fixed seed)
    rng = random.Random(20240613)
    pools = [
        (0x20, 0x7e), (0x20, 0x7e), (0x20, 0x7e), (0xa0, 0x17f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
        (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f), (0x3040, 0x30ff), (0x4e00, 0x4f00),
        (0x9f90, 0x9fb0), (0xac00, 0xad00), (0xff00, 0xffef), (0x2000, 0x206f), (0x1f300, 0x1f6ff),
        (0x1f900, 0x1faff), (0xe000, 0xe010), (0x0, 0x1f), (0x2460, 0x24ff), (0x1c80, 0x1c8f), (0x10000, 0x10100),
    ]
    specials_mix = ["<|user|>", "<think>", "<\uff5cUser\uff5c>", "[gMASK]", "\n", "  ", "'s", "123", "\t", "<mask>",
                    "hello_world", "\u200d"]
    for _ in range(80):
        n = rng.randint(1, 40)
        out = []
        for _ in range(n):
            if rng.random() < 0.08:
                out.append(rng.choice(specials_mix))
            else:
                lo, hi = rng.choice(pools)
                cp = rng.randint(lo, hi)
                if 0xd800 <= cp <= 0xdfff:
                    cp = 0x41
                out.append(chr(cp))
        add("".join(out))
    return s


def vocab_concat_strings(tok, rng, n):
    """Random concatenations of vocab entries, as text (decoded)."""
    size = tok.get_vocab_size(with_added_tokens=True)
    out = []
    for _ in range(n):
        ids = [rng.randrange(size) for _ in range(rng.randint(1, 12))]
        out.append(tok.decode(ids, skip_special_tokens=False))
    return out


def decode_cases(tok, rng, texts):
    size = tok.get_vocab_size(with_added_tokens=True)
    base = tok.get_vocab_size(with_added_tokens=False)
    cases = []
    for _ in range(150):
        cases.append([rng.randrange(size) for _ in range(rng.randint(0, 16))])
    for _ in range(40):  # ids past the tokenizer size (dropped silently), negative-free
        cases.append([rng.randrange(size + 64) for _ in range(rng.randint(1, 8))] + [size + rng.randrange(1000)])
    for t in texts:  # slices of real encodings: split multi-byte characters
        ids = tok.encode(t, add_special_tokens=False).ids
        if len(ids) >= 2 and len(ids) < 200:
            a = rng.randrange(len(ids))
            b = rng.randrange(a, len(ids) + 1)
            cases.append(ids[a:b])
    specials = [t.id for t in [] ]  # placeholder (kept simple)
    del specials
    # Hand-made: a special token inside a character (docs/tokenizer.md §decoding), a real U+FFFD, lone continuation
    # bytes.
    vocab = tok.get_vocab(with_added_tokens=False)
    bl = {b: c for b, c in zip(range(256), _bytes_to_unicode())}
    def byte_id(b):
        return vocab.get(bl[b], vocab.get(f"<0x{b:02X}>"))
    added = tok.get_added_tokens_decoder()
    special_ids = sorted(i for i, t in added.items() if t.special)
    plain_ids = sorted(i for i, t in added.items() if not t.special)
    for seq in [[0xE4, 0xB8], [0xAD], [0xE4, 0xB8, 0xAD], [0xEF, 0xBF, 0xBD], [0x80, 0x80], [0xF0, 0x9F, 0x98],
                [0xF0, 0x9F, 0x98, 0x80], [0xC0, 0xAF], [0xED, 0xA0, 0x80], [0xFF], [0xE4, 0x41]]:
        ids = [byte_id(b) for b in seq]
        if None in ids:
            continue
        cases.append(ids)
        for extra in special_ids[:2] + plain_ids[:2]:
            cases.append(ids[:1] + [extra] + ids[1:])
            cases.append([extra] + ids)
            cases.append(ids + [extra])
    cases.append([])
    cases.append([size + 5, size + 6])
    return cases


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def gen_fixtures():
    strings = hard_strings()
    for name in NAMES:
        d = os.path.join(DATA, name)
        path = os.path.join(d, "tokenizer.json")
        tok = Tokenizer.from_file(path)
        split_tok = Tokenizer.from_file(path)
        split_tok.encode_special_tokens = True
        rng = random.Random(hash_seed(name))
        texts = strings + vocab_concat_strings(tok, rng, 30)
        meta = {"meta": {"tokenizers": tokenizers.__version__, "tokenizer_json_sha256": sha256(path),
                         "generator": "tools/gen_tokenizer_fixtures.py", "count": len(texts)}}
        with open(os.path.join(d, "encode.jsonl"), "w", encoding="ascii") as f:
            f.write(json.dumps(meta, ensure_ascii=True) + "\n")
            for t in texts:
                ids = tok.encode(t, add_special_tokens=False).ids
                rec = {"text": t, "ids": ids}
                special = tok.encode(t, add_special_tokens=True).ids
                if special != ids:  # absent: same as "ids"
                    rec["ids_special"] = special
                split = split_tok.encode(t, add_special_tokens=False).ids
                if split != ids:  # absent: same as "ids"
                    rec["ids_split"] = split
                f.write(json.dumps(rec, ensure_ascii=True) + "\n")
        cases = decode_cases(tok, rng, strings)
        meta["meta"]["count"] = len(cases)
        with open(os.path.join(d, "decode.jsonl"), "w", encoding="ascii") as f:
            f.write(json.dumps(meta, ensure_ascii=True) + "\n")
            for ids in cases:
                rec = {"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                       "text_skip": tok.decode(ids, skip_special_tokens=True)}
                f.write(json.dumps(rec, ensure_ascii=True) + "\n")
        print(f"{name}: {len(texts)} encode cases, {len(cases)} decode cases, "
              f"{os.path.getsize(os.path.join(d, 'encode.jsonl')) // 1024} + "
              f"{os.path.getsize(os.path.join(d, 'decode.jsonl')) // 1024} KiB")


# ---------------------------------------------------------------------------------------------------------------
# Component variants: the committed tokenizers with one part swapped, to cover the pre-tokenizers, normalizers
# and decoders the model families above do not use. variants.jsonl: a {"variant", "base", "patch"} line per
# variant (patch = top-level tokenizer.json fields to replace), then its cases.


def _split(pat, behavior, invert=False, literal=False):
    return {"type": "Split", "pattern": {("String" if literal else "Regex"): pat}, "behavior": behavior,
            "invert": invert}


_BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
ENCODE_VARIANTS = {
    "gpt2_bytelevel_regex": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                               "use_regex": True}, "normalizer": {"type": "NFC"}},
    "split_merged_with_previous": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        _split(r"\s+", "MergedWithPrevious"), _BL]}, "normalizer": {"type": "NFD"}},
    "split_merged_with_next": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        _split(r"[\p{P}\s]", "MergedWithNext"), _BL]}, "normalizer": {"type": "NFKD"}},
    "split_contiguous_lowercase": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        _split(r"\p{L}", "Contiguous"), _BL]}, "normalizer": {"type": "Lowercase"}},
    "split_removed_inverted": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        _split(r"\w+", "Removed", invert=True), _BL]},
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]}},
    "split_string_strip_prepend": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        _split(" ", "Removed", literal=True), _split("ab", "Isolated", literal=True), _BL]},
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "Prepend", "prepend": "_"}]}},
    "whitespace_replace_regex": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, _BL]},
                                 "normalizer": {"type": "Replace", "pattern": {"Regex": r"\d+"}, "content": "#"}},
    "whitespace_split_punctuation": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Isolated"}, _BL]}, "normalizer": None},
    "bert_digits": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "BertPreTokenizer"}, {"type": "Digits", "individual_digits": False}, _BL]}, "normalizer": None},
    "char_delimiter": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "CharDelimiterSplit", "delimiter": "e"}, {"type": "Punctuation", "behavior": "MergedWithNext"},
        _BL]}, "normalizer": None},
}
DECODE_VARIANTS = {
    "decoder_replace": {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": " "}, "content": "_"}, {"type": "ByteFallback"}, {"type": "Fuse"}]}},
    "decoder_strip": {"decoder": {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}},
    "decoder_none": {"decoder": None},
}


def gen_variants():
    strings = [t for t in hard_strings() if 0 < len(t) <= 60][::4]
    out_path = os.path.join(DATA, "variants.jsonl")
    rng = random.Random(99)
    with open(out_path, "w", encoding="ascii") as f:
        f.write(json.dumps({"meta": {"tokenizers": tokenizers.__version__,
                                     "generator": "tools/gen_tokenizer_fixtures.py"}}) + "\n")
        for table, base in [(ENCODE_VARIANTS, "glm5"), (DECODE_VARIANTS, "bytefb")]:
            with open(os.path.join(DATA, base, "tokenizer.json"), encoding="utf-8") as bf:
                base_json = json.load(bf)
            for name, patch in table.items():
                j = dict(base_json)
                j.update(patch)
                tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
                f.write(json.dumps({"variant": name, "base": base, "patch": patch}) + "\n")
                if table is ENCODE_VARIANTS:
                    for t in strings:
                        f.write(json.dumps({"variant": name, "text": t,
                                            "ids": tok.encode(t, add_special_tokens=False).ids}) + "\n")
                else:
                    n = tok.get_vocab_size(with_added_tokens=True)
                    for _ in range(80):
                        ids = [rng.randrange(n) for _ in range(rng.randint(0, 10))]
                        f.write(json.dumps({"variant": name, "ids": ids,
                                            "text": tok.decode(ids, skip_special_tokens=False),
                                            "text_skip": tok.decode(ids, skip_special_tokens=True)}) + "\n")
    print(f"variants: {len(ENCODE_VARIANTS)} x {len(strings)} encode + {len(DECODE_VARIANTS)} x 80 decode cases, "
          f"{os.path.getsize(out_path) // 1024} KiB")


def hash_seed(name):
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


# ---------------------------------------------------------------------------------------------------------------
# Unicode tables

ONIG_PROPS = ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc", "Pd",
              "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp", "Cc", "Cf", "Co",
              "Han", "Hiragana", "Katakana", "Hangul", "Latin", "Greek", "Cyrillic", "Arabic", "Hebrew", "Thai",
              "Devanagari", "Common", "Inherited"]
ONIG_SHORTHANDS = [("s", r"\s"), ("w", r"\w"), ("d", r"\d")]


def all_code_points():
    return [cp for cp in range(0x110000) if not (0xD800 <= cp <= 0xDFFF)]


def onig_members(pattern, cps, text):
    """Code points matched by a one-character regex, as Oniguruma inside `tokenizers` sees it."""
    gaps = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text)
    out = bytearray(b"\x01") * len(cps)
    for _, (a, b) in gaps:  # offsets are in characters
        out[a:b] = b"\x00" * (b - a)
    return [cps[i] for i in range(len(cps)) if out[i]]


def rust_pieces(pt, cps):
    """Pre-tokenizes "aXa<U+3000>" for every code point X (one long string) and returns the set of (start, end)
    character offsets of the pieces; entry i starts at 4 * i."""
    text = "".join("a" + chr(c) + "a\u3000" for c in cps)
    return {off for _, off in pt.pre_tokenize_str(text)}


def to_ranges(members):
    out = []
    for cp in sorted(members):
        if out and out[-1][1] + 1 == cp:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def gen_unicode_tables():
    cps = all_code_points()
    text = "".join(chr(c) for c in cps)
    tables = []
    for p in ONIG_PROPS:
        tables.append((p, to_ranges(onig_members(r"\p{" + p + "}", cps, text))))
        print(p, len(tables[-1][1]), file=sys.stderr)
    for name, pat in ONIG_SHORTHANDS:
        tables.append((name, to_ranges(onig_members(pat, cps, text))))
    # Rust-side classes. Whitespace = \w+|[^\w\s]+ (regex crate): "aXa" is one piece iff X is \w.
    p = rust_pieces(pre_tokenizers.Whitespace(), cps)
    tables.append(("rust_word", to_ranges(cps[i] for i in range(len(cps)) if (4 * i, 4 * i + 3) in p)))
    # Digits(individual=False) isolates runs of char::is_numeric: X numeric iff it is a piece of its own.
    p = rust_pieces(pre_tokenizers.Digits(individual_digits=False), cps)
    tables.append(("rust_numeric", to_ranges(cps[i] for i in range(len(cps)) if (4 * i + 1, 4 * i + 2) in p)))
    # Punctuation isolates each punctuation character.
    p = rust_pieces(pre_tokenizers.Punctuation(), cps)
    tables.append(("rust_punct", to_ranges(cps[i] for i in range(len(cps)) if (4 * i + 1, 4 * i + 2) in p)))
    # StripAccents: the characters it removes (its own is_combining_mark table, older than Oniguruma's).
    sep = "\x00"  # U+0000 itself is neither removed nor changed: leave it out so that it cannot misalign
    nz = [c for c in cps if c != 0]
    out = normalizers.StripAccents().normalize_str(sep.join(chr(c) for c in nz)).split(sep)
    assert len(out) == len(nz)
    tables.append(("rust_combining", to_ranges(nz[i] for i in range(len(nz)) if out[i] == "")))
    # Lowercase: Rust char::to_lowercase, per character.
    out = normalizers.Lowercase().normalize_str(sep.join(chr(c) for c in nz)).split(sep)
    assert len(out) == len(nz)
    lower = [(nz[i], out[i]) for i in range(len(nz)) if out[i] != chr(nz[i])]
    path = os.path.join(ROOT, "src", "tokenizer", "unicode_tables.cpp")
    with open(path, "w", encoding="ascii") as f:
        f.write("// Generated by tools/gen_tokenizer_fixtures.py --unicode-tables from PyPI tokenizers "
                f"{tokenizers.__version__}. Do not edit.\n")
        f.write("// Character classes exactly as the reference tokenizer sees them: Oniguruma's \\p{..}, \\s, \\w, \\d,\n"
                "// and the Rust-side classes (rust_word: regex crate \\w; rust_numeric: char::is_numeric;\n"
                "// rust_punct: the Punctuation pre-tokenizer; rust_combining: StripAccents). Lowercase's mapping is in\n"
                "// unicode_lowercase.cpp.\n")
        f.write('#include "tokenizer/unicode.h"\n\nnamespace latent::unicode {\n\nnamespace {\n')
        write_ranges(f, [t for t in tables if not t[0].startswith("rust_")], "const")
        f.write("}  // namespace\n\n// Rust-side classes: unicode_rust_classes.cpp.\n")
        for name, _ in tables:
            if name.startswith("rust_"):
                f.write(f"extern const CodeRange k_{name}[];\n")
        f.write("\nconst PropertyTable kPropertyTables[] = {\n")
        for name, ranges in tables:
            f.write(f'    {{"{name}", k_{name}, {len(ranges)}}},\n')
        f.write("};\nconst size_t kPropertyTableCount = sizeof(kPropertyTables) / sizeof(kPropertyTables[0]);\n\n"
                "}  // namespace latent::unicode\n")
    print(f"wrote {path}")
    path = os.path.join(ROOT, "src", "tokenizer", "unicode_rust_classes.cpp")
    with open(path, "w", encoding="ascii") as f:
        f.write("// Generated by tools/gen_tokenizer_fixtures.py --unicode-tables from PyPI tokenizers "
                f"{tokenizers.__version__}. Do not edit.\n")
        f.write("// The Rust-side character classes of the reference tokenizer (rust_word: regex crate \\w; rust_numeric:\n"
                "// char::is_numeric; rust_punct: the Punctuation pre-tokenizer; rust_combining: StripAccents), registered in\n"
                "// unicode_tables.cpp.\n")
        f.write('#include "tokenizer/unicode.h"\n\nnamespace latent::unicode {\n\n')
        write_ranges(f, [t for t in tables if t[0].startswith("rust_")], "extern const")
        f.write("\n}  // namespace latent::unicode\n")
    print(f"wrote {path}")
    write_lowercase(lower, ROOT)


def write_ranges(f, tables, storage):
    for name, ranges in tables:
        f.write(f"{storage} CodeRange k_{name}[] = {{\n")
        line = ""
        for a, b in ranges:
            item = f"{{0x{a:X}, 0x{b:X}}}, "
            if len(line) + len(item) > 112:
                f.write("    " + line.rstrip() + "\n")
                line = ""
            line += item
        if line:
            f.write("    " + line.rstrip() + "\n")
        f.write("};\n")


def write_lowercase(lower, root):
    path = os.path.join(root, "src", "tokenizer", "unicode_lowercase.cpp")
    with open(path, "w", encoding="ascii") as f:
        f.write("// Generated by tools/gen_tokenizer_fixtures.py --unicode-tables from PyPI tokenizers "
                f"{tokenizers.__version__}. Do not edit.\n")
        f.write("// The Lowercase normalizer's mapping (Rust char::to_lowercase), per character.\n")
        f.write('#include "tokenizer/unicode.h"\n\nnamespace latent::unicode {\n\n')
        f.write("// Lowercase mappings (code point -> UTF-8), sorted by code point.\nconst LowercaseEntry kLowercase[] = {\n")
        line = ""
        for cp, lo in lower:
            esc = "".join(f"\\x{b:02X}" for b in lo.encode("utf-8"))
            item = f'{{0x{cp:X}, "{esc}"}}, '
            if len(line) + len(item) > 112:
                f.write("    " + line.rstrip() + "\n")
                line = ""
            line += item
        if line:
            f.write("    " + line.rstrip() + "\n")
        f.write("};\nconst size_t kLowercaseCount = sizeof(kLowercase) / sizeof(kLowercase[0]);\n\n"
                "}  // namespace latent::unicode\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unicode-tables", action="store_true", help="regenerate src/tokenizer/unicode_tables.cpp")
    args = ap.parse_args()
    if args.unicode_tables:
        gen_unicode_tables()
    else:
        n = len(hard_strings())
        print(f"tokenizers {tokenizers.__version__}; {n} hard strings")
        gen_fixtures()
        gen_variants()


if __name__ == "__main__":
    main()
