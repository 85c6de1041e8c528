#!/usr/bin/env python3
"""Generates the tokenizer parity fixtures with Hugging Face tokenizers (the reference).

    python3 tools/make_tokenizer_fixtures.py OUT_DIR     (needs the `tokenizers` package)

and copy OUT_DIR over tests/fixtures/tokenizers/. For each tokenizer it writes
  NAME/tokenizer.json   trained here on text from the installed Python packages
  NAME/corpus.jsonl     {"text"}: the hard cases below, then sampled lines
  NAME/expected.jsonl   {"ids"}: encode(text) with the post-processor's special tokens
  NAME/decoded.jsonl    {"text"}: decode(ids, skip_special_tokens=False)
The tokenizers:
  bytelevel      Llama 3 / GPT-2 style: Split(llama3 regex) + ByteLevel, ignore_merges,
                 BOS by TemplateProcessing inside a Sequence post-processor
  sentencepiece  Llama 2 / TinyLlama style: Prepend + Replace normalizers, no
                 pre-tokenizer, byte_fallback with <0xXX> tokens, <s> BOS
  metaspace      Mistral style: Metaspace pre-tokenizer (prepend_scheme first), byte_fallback
"""
import glob
import json
import os
import random
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def hard_cases(specials):
    rng = random.Random(11)
    long_word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10000))
    return [
        "", " ", "   ", "\t", "\n", "\r\n", " \t \n\n  \r\n\t\t",
        "Hello world", " Hello world", "Hello  world", "Hello\tworld", "Hello\r\nworld\r\n",
        "I'm sure they'll say it's what we've done, isn't it? I'D SAY SO", "don't DON'T Don't",
        "1234567890123456789 and 3.14159 and 1,000,000 and 0x1F",
        "日本語のテキストと漢字、それから中文也有。", "한국어 문장입니다.",
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "العربية نص مكتوب من اليمين إلى اليسار", "עברית", "हिन्दी भाषा", "ภาษาไทย",
        "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "Combining: e\u0301 a\u0308 n\u0303 \u0041\u030A",
        "Z\u0351\u036b\u0343a\u0310\u0346l\u0352go", "\u00a0nbsp\u2003em\u3000ideographic",
        "next\u0085line and \ufeffbyte order mark \ufeff", "\u0085 \ufeff\u0085",
        "tabs\t\tand    runs of      spaces   ", "trailing spaces    ", "    leading spaces",
        "def f(x):\n    return x ** 2  # comment\n", "{\"json\": [1, 2, {\"k\": null}]}",
        "url: https://example.com/a?b=c&d=e#f", "mixed日本語English123русский",
        specials[0] + "text after a special token", "before " + specials[1] + " after",
        specials[0] + specials[1], "not special: <|begin_of_tex|> <s > </ s>",
        long_word, "x" * 3000, "ab" * 700,
    ]


def training_text():
    """Docstrings and comments of installed Python packages: real English and code."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(tokenizers.__file__), "..", "transformers",
                                          "models", "*", "modeling_*.py")))[:120]
    lines = []
    for path in files:
        with open(path, encoding="utf-8", errors="ignore") as f:
            lines.extend(l.rstrip("\n") for l in f if l.strip())
    return lines


def bytelevel(texts, vocab_size=3000):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{specials[0]} $A", pair=f"{specials[0]} $A {specials[0]} $B",
                                      special_tokens=[(specials[0], bos)])])
    return tok, specials


def with_byte_tokens(tok):
    """Adds <0x00>..<0xFF> to the model's vocabulary, as Llama 2's has them."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        name = f"<0x{b:02X}>"
        if name not in vocab:
            vocab[name] = len(vocab)
    return Tokenizer.from_str(json.dumps(j))


def train_byte_fallback(tok, texts):
    """Trains a byte-fallback BPE `tok` (normalizer/pre-tokenizer/decoder set) the
    way both SentencePiece-style tokenizers here are made: <unk>, <s>, </s>, then
    the <0xXX> byte tokens, and a <s> BOS template."""
    tok.train_from_iterator([t[:200] for t in texts[:30000]], trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    tok = with_byte_tokens(tok)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok, ["<s>", "</s>", "<unk>"]


def sentencepiece(texts):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return train_byte_fallback(tok, texts)


def metaspace(texts):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    return train_byte_fallback(tok, texts)


def main():
    out = sys.argv[1]
    texts = training_text()
    rng = random.Random(5)
    sample = rng.sample(texts, min(400, len(texts)))
    for name, make in (("bytelevel", bytelevel), ("sentencepiece", sentencepiece), ("metaspace", metaspace)):
        tok, specials = make(texts)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        corpus = hard_cases(specials) + sample
        with open(os.path.join(d, "corpus.jsonl"), "w") as c, \
                open(os.path.join(d, "expected.jsonl"), "w") as e, \
                open(os.path.join(d, "decoded.jsonl"), "w") as dd:
            for text in corpus:
                ids = tok.encode(text).ids
                c.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                e.write(json.dumps({"ids": ids}) + "\n")
                dd.write(json.dumps({"text": tok.decode(ids, skip_special_tokens=False)}, ensure_ascii=False) + "\n")
        print(name, "vocab", tok.get_vocab_size(), "lines", len(corpus), "tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
