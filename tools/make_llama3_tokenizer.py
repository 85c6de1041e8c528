#!/usr/bin/env python3
"""Rebuilds Meta Llama 3's tokenizer.json (128,000-token byte-level BPE) from the npm package
`llama3-tokenizer-js`, which ships the vocabulary and the merges as data. Standard library only.

    python3 tools/make_llama3_tokenizer.py OUT_DIR [--package PATH] [--specials llama3|package]

  --package PATH   the unpacked npm package (the folder holding package.json; its parent, as
                   `tar xzf` leaves it, is accepted too) or its .tgz; no network needed.
                   Without it: `npm pack llama3-tokenizer-js@1.2.0` into a temporary folder.
  --specials       llama3 (default): the 256 added tokens of Meta-Llama-3-8B(-Instruct),
                     128000 <|begin_of_text|>, 128001 <|end_of_text|>, 128002..128005
                     <|reserved_special_token_0..3|>, 128006 <|start_header_id|>, 128007
                     <|end_header_id|>, 128008 <|reserved_special_token_4|>, 128009 <|eot_id|>,
                     128010..128255 <|reserved_special_token_5..250|> (Meta's llama3 tokenizer.py);
                   package: the package's own list (llama3SpecialTokens in its JS source), which
                     is Llama 3.1's: 128004 <|finetune_right_pad_id|>, 128008 <|eom_id|>,
                     128010 <|python_tag|>, reserved tokens renumbered 0..247.
Writes
  OUT_DIR/tokenizer.json         as tokenizers 0.20+ saves Meta-Llama-3-8B's: BPE, ignore_merges,
                                 merges as 2-element lists in rank order, Split(Llama 3 regex) +
                                 ByteLevel, <|begin_of_text|> added by TemplateProcessing
  OUT_DIR/tokenizer_config.json  bos_token <|begin_of_text|>, eos_token <|eot_id|>, the Llama 3
                                 Instruct chat_template, added_tokens_decoder
The package's data (src/data-converted.js or the bundle): `llama_vocab_base64`, base64 of the
tokens (ByteLevel strings) joined by "\n" in id order; `llama_merges_binary`, base64 of the merges
as pairs of vocabulary ids, 17 bits each, big-endian bit order (see its src/data-conversion.py).
"""
import argparse
import base64
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

NPM_SPEC = "llama3-tokenizer-js@1.2.0"
VOCAB_SIZE = 128000
N_MERGES = 280147  # Meta-Llama-3-8B's tokenizer.json
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS, EOS_INSTRUCT = "<|begin_of_text|>", "<|eot_id|>"
# Meta-Llama-3-8B-Instruct's tokenizer_config.json chat_template (as tools/make_chat_fixtures.py).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Known ids (the package's own tests: "This is a test sentence." -> 2028 374 264 1296 11914 13).
KNOWN = {2028: "This", 374: "Ġis", 264: "Ġa", 1296: "Ġtest", 11914: "Ġsentence", 13: ".", 198: "Ċ",
         220: "Ġ", 279: "Ġthe"}


def llama3_specials():
    """Meta's llama3/tokenizer.py (num_reserved_special_tokens = 256)."""
    names = [BOS, "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>",
             "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
    return names + [f"<|reserved_special_token_{i}|>" for i in range(5, 256 - 5)]


def package_specials(source):
    """llama3SpecialTokens of the package's JS: an array literal, then a push loop."""
    m = re.search(r"const llama3SpecialTokens = \[(.*?)\];\s*for \(let i = (\d+); i <= (\d+); i\+\+\) \{\s*"
                  r"llama3SpecialTokens\.push\(`<\|reserved_special_token_\$\{i\}\|>`\);", source, re.S)
    if not m:
        sys.exit("error: llama3SpecialTokens not found in the package's source (format changed?)")
    names = re.findall(r"'([^']*)'", m.group(1))
    return names + [f"<|reserved_special_token_{i}|>" for i in range(int(m.group(2)), int(m.group(3)) + 1)]


def find_package(path, tmp):
    """The package root (holding package.json) in PATH: the folder itself, PATH/package, or a .tgz
    unpacked into the folder tmp."""
    if os.path.isfile(path) and (path.endswith(".tgz") or path.endswith(".tar.gz")):
        with tarfile.open(path) as t:
            if hasattr(tarfile, "data_filter"):
                t.extractall(tmp, filter="data")
            else:
                t.extractall(tmp)
        path = tmp
    for root in (path, os.path.join(path, "package")):
        if os.path.isfile(os.path.join(root, "package.json")):
            return root
    sys.exit(f"error: {path}: no package.json (give the unpacked llama3-tokenizer-js folder or its .tgz)")


def npm_pack(tmp):
    print(f"npm pack {NPM_SPEC} in {tmp}", file=sys.stderr)
    try:
        subprocess.run(["npm", "pack", "--loglevel=warn", NPM_SPEC], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"error: npm pack {NPM_SPEC} failed ({e}); download the package elsewhere and pass --package")
    tgz = glob.glob(os.path.join(tmp, "*.tgz"))
    if len(tgz) != 1:
        sys.exit(f"error: npm pack left {tgz} in {tmp}")
    return find_package(tgz[0], tmp)


def read_sources(root):
    """(data source text, tokenizer source text) of the package."""
    candidates = [os.path.join(root, "src", "data-converted.js"),
                  os.path.join(root, "bundle", "llama3-tokenizer-with-baked-data.js")]
    candidates += sorted(glob.glob(os.path.join(root, "**", "*.js"), recursive=True))
    data = None
    for c in candidates:
        if os.path.isfile(c):
            with open(c, encoding="utf-8") as f:
                text = f.read()
            if "llama_vocab_base64" in text and "llama_merges_binary" in text:
                data = text
                break
    if data is None:
        sys.exit(f"error: {root}: no .js file holds llama_vocab_base64 and llama_merges_binary")
    code = None
    for c in [os.path.join(root, "src", "llama3-tokenizer.js")] + candidates:
        if os.path.isfile(c):
            with open(c, encoding="utf-8") as f:
                text = f.read()
            if "const llama3SpecialTokens" in text:
                code = text
                break
    return data, code


def decode_data(source):
    def blob(name):
        m = re.search(r"const " + name + r'\s*=\s*"([A-Za-z0-9+/=]*)"', source)
        if not m:
            sys.exit(f"error: {name} not found in the package's data")
        return base64.b64decode(m.group(1), validate=True)

    vocab = blob("llama_vocab_base64").decode("utf-8").split("\n")
    raw = blob("llama_merges_binary")
    nbits = len(raw) * 8
    n_ids = nbits // 17  # what is left over (under 17 bits) is padding
    padded = raw + b"\0\0"
    ids = []
    for k in range(n_ids - n_ids % 2):  # id k: bits 17k..17k+16, inside bytes 17k//8 .. +2
        bit = 17 * k
        word = int.from_bytes(padded[bit >> 3:(bit >> 3) + 3], "big")
        ids.append((word >> (7 - (bit & 7))) & 0x1FFFF)
    merges = [(ids[i], ids[i + 1]) for i in range(0, len(ids), 2)]
    return vocab, merges


def check(vocab, merges):
    errors = []
    if len(vocab) != VOCAB_SIZE:
        errors.append(f"vocab has {len(vocab)} tokens, expected {VOCAB_SIZE}")
    if len(set(vocab)) != len(vocab):
        errors.append("vocab has duplicate tokens")
    for i, tok in KNOWN.items():
        if i < len(vocab) and vocab[i] != tok:
            errors.append(f"vocab id {i} is {vocab[i]!r}, expected {tok!r}")
    index = {t: i for i, t in enumerate(vocab)}
    bad = [(a, b) for a, b in merges if a >= len(vocab) or b >= len(vocab) or vocab[a] + vocab[b] not in index]
    if bad:
        errors.append(f"{len(bad)} merges do not make a vocab token (first {bad[:3]})")
    if len(set(merges)) != len(merges):
        errors.append("duplicate merges")
    if len(merges) != N_MERGES:
        errors.append(f"{len(merges)} merges, expected {N_MERGES}")
    # The 256 ByteLevel characters must all be single-character tokens.
    byte_chars = [chr(c) for c in list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))]
    byte_chars += [chr(0x100 + n) for n in range(256 - len(byte_chars))]
    missing = [c for c in byte_chars if c not in index]
    if missing:
        errors.append(f"byte characters missing from the vocab: {missing[:5]}")
    if errors:
        sys.exit("error: the package's data is not Llama 3's:\n  " + "\n  ".join(errors))


def added_token(i, name):
    return {"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def tokenizer_json(vocab, merges, specials):
    bos_id = VOCAB_SIZE + specials.index(BOS)
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [bos_id], "tokens": [BOS]}},
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added_token(VOCAB_SIZE + i, name) for i, name in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            template]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
            "vocab": {tok: i for i, tok in enumerate(vocab)},
            "merges": [[vocab[a], vocab[b]] for a, b in merges],
        },
    }


def tokenizer_config(specials):
    return {
        "added_tokens_decoder": {str(VOCAB_SIZE + i): {k: v for k, v in added_token(0, name).items() if k != "id"}
                                 for i, name in enumerate(specials)},
        "bos_token": BOS,
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": EOS_INSTRUCT,
        "model_input_names": ["input_ids", "attention_mask"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--package", help="unpacked llama3-tokenizer-js folder (or its .tgz); default: npm pack")
    p.add_argument("--specials", choices=["llama3", "package"], default="llama3",
                   help="added tokens: Meta-Llama-3-8B's (default) or the package's list (Llama 3.1's)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="llama3-tokenizer-js.") as tmp:
        root = find_package(a.package, tmp) if a.package else npm_pack(tmp)
        return build(a, root)


def build(a, root):
    with open(os.path.join(root, "package.json"), encoding="utf-8") as f:
        pkg = json.load(f)
    data, code = read_sources(root)
    vocab, merges = decode_data(data)
    check(vocab, merges)
    if a.specials == "package":
        if code is None:
            sys.exit("error: the package's tokenizer source (llama3SpecialTokens) not found")
        specials = package_specials(code)
    else:
        specials = llama3_specials()
    if len(specials) != 256 or len(set(specials)) != 256 or specials[:2] != [BOS, "<|end_of_text|>"] \
            or specials[9] != EOS_INSTRUCT or set(specials) & set(vocab):
        sys.exit(f"error: bad special token list ({len(specials)} tokens)")
    os.makedirs(a.out_dir, exist_ok=True)
    out = os.path.join(a.out_dir, "tokenizer.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab, merges, specials), f, ensure_ascii=False, indent=2)
    with open(os.path.join(a.out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(specials), f, ensure_ascii=False, indent=2)
    with open(out, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(f"{out}: {pkg.get('name')} {pkg.get('version')}, vocab {len(vocab)} + {len(specials)} added "
          f"({a.specials}), {len(merges)} merges, {os.path.getsize(out)} bytes, sha256 {digest[:16]}")


if __name__ == "__main__":
    main()
