#!/usr/bin/env python3
"""Tokens per second of `trainerd-worker tokenize` against Hugging Face tokenizers.

    python3 bench/tokenizer/tokenizer_bench.py --worker build/bin/trainerd-worker [--out DIR]
        [--corpus-mb 32] [--runs 3] [--threads N] [--tokenizers DIR] [--extra-tokenizer NAME=PATH ...]

Needs the standard library and the `tokenizers` package only (transformers, when installed, is
read as text for the corpus, never imported). Steps:
  1. corpus: JSONL {"text"} lines of mixed lengths, deterministic (seeded): paragraphs and
     docstrings of the installed Python sources (transformers, tokenizers, the standard library),
     the hard cases of tools/make_tokenizer_fixtures.py, and non-Latin text made by repeating
     its multilingual samples.
  2. tokenizers, trained with HF tokenizers on part of the corpus (or taken from --tokenizers DIR,
     DIR/NAME/tokenizer.json): `bytelevel` (Llama 3 style: Split(Llama 3 regex) + ByteLevel,
     ignore_merges, 128K vocabulary, 32K if training that takes longer than --train-timeout) and
     `sentencepiece` (Llama 2 style: Prepend + Replace normalizers, no pre-tokenizer,
     byte_fallback, 32K). Each --extra-tokenizer NAME=PATH adds an existing tokenizer.json (e.g.
     llama3-real=.gpu-run/llama3/tokenizer.json, made by tools/make_llama3_tokenizer.py), measured
     the same way.
  3. for each tokenizer and thread count (1 and all cores), best of --runs:
     HF encode only: texts already in memory, the fastest of encode_batch_fast, encode_batch and
       (one thread) encode per line, ids read into Python lists; a separate process per thread
       count with RAYON_NUM_THREADS set;
     HF with JSON I/O: Tokenizer.from_file, then the corpus file read in batches of 4096 lines,
       json.loads, the same encode method, json.dumps({"ids"}) written to a file;
     trainerd: the whole `trainerd-worker tokenize --threads N` process, corpus file on stdin,
       output to a file (process start, tokenizer.json loading, JSON parsing and writing included).
     Tokens/s = tokens in the output (special tokens included) / seconds. trainerd's ids are checked
     against HF's on every line.
  4. writes OUT/tokenizer-bench.md (the table, the machine, the versions) and OUT/results.json.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import platform
import random
import re
import subprocess
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BATCH_LINES = 4096  # HF's JSON I/O batch: the same as trainerd-worker tokenize's

# ---------------------------------------------------------------------------------------------
# Corpus


def fixture_tools():
    """tools/make_tokenizer_fixtures.py (imports `tokenizers`)."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import make_tokenizer_fixtures
    return make_tokenizer_fixtures


def source_roots():
    """Folders of Python sources to read: installed packages (found without importing them)
    and the standard library."""
    roots = []
    for name in ("transformers", "tokenizers", "huggingface_hub", "safetensors", "peft"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            roots.append(os.path.realpath(list(spec.submodule_search_locations)[0]))
    roots.append(os.path.realpath(sysconfig.get_paths()["stdlib"]))
    return roots


def python_files(roots):
    files = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames
                                 if d not in ("site-packages", "dist-packages", "__pycache__"))
            files.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return files


DOCSTRING = re.compile(r'"""(.*?)"""', re.S)
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
MAX_CHARS = 32768  # the longest text in the corpus


def make_corpus(path, corpus_mb, seed):
    """Writes ~corpus_mb MB of text (UTF-8 bytes of the texts) as JSONL {"text"}; returns stats."""
    rng = random.Random(seed)
    target = int(corpus_mb * 1e6)
    files = python_files(source_roots())
    rng.shuffle(files)
    texts, size = [], 0

    def add(text):
        nonlocal size
        while len(text) > MAX_CHARS:  # a long text is cut at a line break (or anywhere) into parts
            cut = text.rfind("\n", 0, MAX_CHARS) + 1 or MAX_CHARS
            add(text[:cut])
            text = text[cut:]
        texts.append(text)
        size += len(text.encode("utf-8"))

    tools = fixture_tools()
    hard = tools.hard_cases(["<|begin_of_text|>", "</s>"])
    for text in hard:
        add(text)
    # Non-Latin text (~8% of the corpus): the multilingual hard cases, repeated and mixed.
    samples = [t for t in hard if any(ord(c) > 0x2000 for c in t) and len(t) < 1000]
    separators = [" ", "\n", ". ", ", ", "\n\n", ""]
    non_latin = []
    nl_size = 0
    while nl_size < 0.08 * target:
        n = rng.choice([1, 2, 3, 5, 8, 13, 30, 80])
        text = "".join(rng.choice(samples) + rng.choice(separators) for _ in range(n)).strip()
        non_latin.append(text)
        nl_size += len(text.encode("utf-8"))
    # Source files: paragraphs grouped into texts of mixed lengths, and docstrings on their own.
    files_used = 0
    for path_ in files:
        if size + nl_size >= target:
            break
        try:
            with open(path_, encoding="utf-8") as f:
                source = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        files_used += 1
        paragraphs = [p for p in PARAGRAPH_BREAK.split(source) if p.strip()]
        i = 0
        while i < len(paragraphs):
            r = rng.random()
            k = 1 if r < 0.55 else rng.randint(2, 4) if r < 0.8 else rng.randint(5, 15) if r < 0.95 \
                else rng.randint(16, 60)
            add("\n\n".join(paragraphs[i:i + k]))
            i += k
        if rng.random() < 0.5:
            for doc in DOCSTRING.findall(source):
                if len(doc.strip()) > 40:
                    add(doc.strip())
    texts.extend(non_latin)
    size += nl_size
    head, tail = texts[:len(hard)], texts[len(hard):]
    rng.shuffle(tail)
    texts = head + tail
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    lengths = sorted(len(t) for t in texts)
    return {"lines": len(texts), "text_bytes": size, "file_bytes": os.path.getsize(path),
            "sha256": h.hexdigest()[:16], "source_files": files_used,
            "median_chars": lengths[len(lengths) // 2], "p99_chars": lengths[int(len(lengths) * 0.99)],
            "max_chars": lengths[-1]}


def read_texts(corpus):
    with open(corpus, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


# ---------------------------------------------------------------------------------------------
# Tokenizers (HF tokenizers), in a subprocess: `_train`


def train_texts(corpus, train_mb, seed):
    """A random part of the corpus, about train_mb MB."""
    texts = read_texts(corpus)
    random.Random(seed).shuffle(texts)
    out, size = [], 0
    for t in texts:
        if size >= train_mb * 1e6:
            break
        out.append(t)
        size += len(t)
    return out


def train_bytelevel(texts, vocab_size):
    """Llama 3 style: make_tokenizer_fixtures.bytelevel() with a real vocabulary size."""
    tok, _ = fixture_tools().bytelevel(texts, vocab_size)
    return tok


def train_sentencepiece(texts, vocab_size):
    """Llama 2 style, as make_tokenizer_fixtures.sentencepiece(): Prepend("▁") + Replace(" ", "▁"),
    no pre-tokenizer, byte_fallback with <0xXX> tokens, <s> BOS. Trained the way SentencePiece
    does, on words: a training-only pre-tokenizer cuts the text before each "▁" (a run of "▁"
    keeps all but its last one), and is removed after training, as Llama 2 has none."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tools = fixture_tools()
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("▁?[^▁]+|▁+(?=▁[^▁])|▁+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size - 256, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=1000,
        show_progress=False))
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = None
    tok = tools.with_byte_tokens(Tokenizer.from_str(json.dumps(j)))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


TRAINERS = {"bytelevel": train_bytelevel, "sentencepiece": train_sentencepiece}


def cmd_train(a):
    texts = train_texts(a.corpus, a.train_mb, a.seed)
    start = time.perf_counter()
    tok = TRAINERS[a.kind](texts, a.vocab)
    seconds = time.perf_counter() - start
    os.makedirs(os.path.dirname(a.output), exist_ok=True)
    tok.save(a.output)
    print(json.dumps({"train_seconds": round(seconds, 1), "vocab": tok.get_vocab_size(),
                      "train_texts": len(texts)}))


# ---------------------------------------------------------------------------------------------
# HF measurement, in a subprocess per thread count (RAYON_NUM_THREADS is read once): `_hf`


def cmd_hf(a):
    from tokenizers import Tokenizer
    texts = read_texts(a.corpus)

    def method(name, tok):
        """texts -> their ids as Python lists, with one of HF's encode methods."""
        return {"encode_batch_fast": lambda batch: [e.ids for e in tok.encode_batch_fast(batch)],
                "encode_batch": lambda batch: [e.ids for e in tok.encode_batch(batch)],
                "encode per line": lambda batch: [tok.encode(t).ids for t in batch]}[name]

    names = (["encode_batch_fast"] if hasattr(Tokenizer, "encode_batch_fast") else []) + ["encode_batch"]
    if a.per_line:
        names.append("encode per line")

    def timed(fn):
        start = time.perf_counter()
        result = fn()
        return time.perf_counter() - start, result

    # Each method once on a tenth of the corpus; then the fastest one's runs on all of it.
    trial = texts[:max(1, len(texts) // 10)]
    first, counts = {}, set()
    for name in names:  # each with a fresh tokenizer (its cache cold)
        fn = method(name, Tokenizer.from_file(a.tokenizer))
        seconds, ids = timed(lambda: fn(trial))
        first[name] = seconds
        counts.add(sum(len(x) for x in ids))
        del ids
    if len(counts) != 1:
        sys.exit(f"HF methods disagree on the token count: {sorted(counts)}")
    best_method = min(first, key=first.get)
    encode = method(best_method, Tokenizer.from_file(a.tokenizer))
    encode_times = []
    for _ in range(a.runs):
        seconds, ids = timed(lambda: encode(texts))
        encode_times.append(seconds)
        tokens = sum(len(x) for x in ids)
        del ids

    def with_io():
        fn = method(best_method, Tokenizer.from_file(a.tokenizer))  # a fresh one each run, as trainerd's
        with open(a.corpus, encoding="utf-8") as fin, open(a.ids_out, "w", encoding="utf-8") as fout:
            batch = []
            for line in fin:
                batch.append(json.loads(line)["text"])
                if len(batch) == BATCH_LINES:
                    fout.write("".join(json.dumps({"ids": ids}) + "\n" for ids in fn(batch)))
                    batch = []
            if batch:
                fout.write("".join(json.dumps({"ids": ids}) + "\n" for ids in fn(batch)))

    io_times = [timed(with_io)[0] for _ in range(a.runs)]
    print(json.dumps({"method": best_method, "trial_seconds": first, "tokens": tokens,
                      "encode_seconds": encode_times, "io_seconds": io_times,
                      "rayon_threads": os.environ.get("RAYON_NUM_THREADS")}))


# ---------------------------------------------------------------------------------------------
# The benchmark: `run`


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def count_tokens(path):
    """Tokens in a JSONL {"ids": [...]} file written as `{"ids": [1, 2]}`."""
    n = 0
    with open(path, "rb") as f:
        for line in f:
            if b"[]" not in line:
                n += line.count(b",") + 1
    return n


def compare_ids(ours, theirs, limit=5):
    """Lines whose ids differ (parsed, so spacing does not matter); returns (count, examples)."""
    bad, examples = 0, []
    with open(ours, "rb") as a, open(theirs, "rb") as b:
        for i, (x, y) in enumerate(zip(a, b), 1):
            if x != y and json.loads(x)["ids"] != json.loads(y)["ids"]:
                bad += 1
                if len(examples) < limit:
                    examples.append(i)
    with open(ours, "rb") as a, open(theirs, "rb") as b:
        na, nb = sum(1 for _ in a), sum(1 for _ in b)
    if na != nb:
        bad += abs(na - nb)
        examples.append(f"line counts differ: trainerd {na}, HF {nb}")
    return bad, examples


def run_trainerd(worker, tokenizer, corpus, threads, runs, out_path):
    times = []
    for _ in range(runs):
        with open(corpus, "rb") as fin, open(out_path, "wb") as fout:
            start = time.perf_counter()
            p = subprocess.run([worker, "tokenize", "--threads", str(threads), tokenizer],
                               stdin=fin, stdout=fout, stderr=subprocess.PIPE)
            times.append(time.perf_counter() - start)
        if p.returncode != 0:
            raise RuntimeError(f"trainerd-worker tokenize failed ({p.returncode}): "
                               f"{p.stderr.decode(errors='replace')[-2000:]}")
    return times


def trainerd_startup(worker, tokenizer, runs):
    """Seconds of `trainerd-worker --help` (process start) and of tokenize on empty input (start and
    tokenizer.json loading): the fixed cost inside every trainerd figure."""
    def best(cmd):
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - start)
        return min(times)
    return {"help_s": best([worker, "--help"]), "empty_tokenize_s": best([worker, "tokenize", tokenizer])}


def run_hf(tokenizer, corpus, threads, runs, ids_out):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    cmd = [sys.executable, os.path.abspath(__file__), "_hf", "--tokenizer", tokenizer, "--corpus", corpus,
           "--runs", str(runs), "--ids-out", ids_out] + (["--per-line"] if threads == 1 else [])
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"HF measurement failed ({p.returncode}): {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def train(name, corpus, work, a):
    out = os.path.join(work, "tokenizers", name, "tokenizer.json")
    vocabs = [a.bytelevel_vocab, 32000] if name == "bytelevel" else [a.sentencepiece_vocab]
    for i, vocab in enumerate(vocabs):
        cmd = [sys.executable, os.path.abspath(__file__), "_train", "--kind", name, "--vocab", str(vocab),
               "--corpus", corpus, "--train-mb", str(a.train_mb), "--seed", str(a.seed), "--output", out]
        log(f"training {name}, vocab {vocab}, on ~{a.train_mb} MB of the corpus")
        start = time.perf_counter()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=a.train_timeout if i + 1 < len(vocabs) else None)
        except subprocess.TimeoutExpired:
            log(f"  more than {a.train_timeout} s: stopped, trying a smaller vocabulary")
            continue
        if p.returncode != 0:
            raise RuntimeError(f"training {name} failed: {p.stderr[-3000:]}")
        info = json.loads(p.stdout.strip().splitlines()[-1])
        info["wall_seconds"] = round(time.perf_counter() - start, 1)
        if i > 0:
            info["note"] = f"vocab {vocabs[0]} took over {a.train_timeout} s to train"
        log(f"  {info}")
        return out, info
    raise RuntimeError(f"could not train {name}")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(worker):
    from importlib import metadata
    v = {"python": platform.python_version()}
    for pkg in ("tokenizers", "transformers"):
        try:
            v[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            try:
                v[pkg] = __import__(pkg).__version__
            except ImportError:
                v[pkg] = "not installed"
    try:
        v["trainerd"] = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip() or "unknown"
        if subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD"], capture_output=True).returncode == 1:
            v["trainerd"] += " + uncommitted changes"
    except OSError:
        v["trainerd"] = "unknown"
    return v


def fmt_rate(x):
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}K"


def report(results, meta):
    lines = ["# trainerd-worker tokenize vs HF tokenizers: tokens per second", ""]
    lines.append(f"Machine: {meta['cpu']}, {meta['cores']} cores usable ({meta['cpu_count']} online); "
                 + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".")
    c = meta["corpus"]
    lines.append(f"Corpus: {c['lines']} lines, {c['text_bytes'] / 1e6:.1f} MB of text "
                 f"({c['file_bytes'] / 1e6:.1f} MB JSONL; median {c['median_chars']} chars a line, p99 "
                 f"{c['p99_chars']}, max {c['max_chars']}; sha256 {c['sha256']}). Best of {meta['runs']} runs.")
    lines.append("")
    lines.append("| tokenizer | threads | HF encode only | HF + JSON I/O | trainerd (whole process) "
                 "| trainerd / HF+I/O | trainerd / HF encode |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in results:
        lines.append(f"| {r['tokenizer']} | {r['threads']} | {fmt_rate(r['hf_encode_tps'])} | "
                     f"{fmt_rate(r['hf_io_tps'])} | {fmt_rate(r['trainerd_tps'])} | "
                     f"{r['trainerd_tps'] / r['hf_io_tps']:.2f}x | {r['trainerd_tps'] / r['hf_encode_tps']:.2f}x |")
    lines.append("")
    lines.append("Tokens/s; ratio > 1: trainerd faster. HF encode only: texts in memory, ids read into Python "
                 "lists, the fastest HF method (below). HF + JSON I/O: Tokenizer.from_file, json.loads per line, "
                 f"encode in batches of {BATCH_LINES}, json.dumps, written to a file. trainerd: the whole "
                 "`trainerd-worker tokenize --threads N` process (start, tokenizer.json loading, JSON in and "
                 "out, corpus on stdin, ids to a file).")
    lines.append("")
    for name, t in meta["tokenizers"].items():
        parity = meta["parity"].get(name, {})
        lines.append(f"- {name}: vocab {t.get('vocab')}, {t.get('tokens', 0)} tokens in the corpus "
                     f"({t.get('tokens', 0) and c['text_bytes'] / t['tokens']:.2f} bytes/token); "
                     + (f"trained in {t['train_seconds']} s on {t['train_texts']} texts; " if 'train_seconds' in t
                        else f"from {t.get('path')}; ")
                     + (t.get("note", "") + "; " if t.get("note") else "")
                     + f"trainerd fixed cost: {t['help_s']:.2f} s process start (`--help`), "
                       f"{t['empty_tokenize_s']:.2f} s tokenize of empty input (start + tokenizer.json); "
                     + f"ids differing from HF: {parity.get('mismatched_lines', '?')} lines"
                     + (f" (first: {parity['examples']})" if parity.get("examples") else "")
                     + (f"; trainerd --threads 1 vs --threads N output differ on {parity['thread_diff_lines']} lines"
                        if parity.get("thread_diff_lines") else ""))
    for r in results:
        lines.append(f"- {r['tokenizer']}, {r['threads']} thread(s): HF method {r['hf_method']} (on a tenth of the "
                     "corpus: " + ", ".join(f"{k} {v:.2f} s" for k, v in r["hf_trials"].items())
                     + f"); seconds: HF encode {r['hf_encode_s']:.2f}, HF + I/O {r['hf_io_s']:.2f}, "
                     f"trainerd {r['trainerd_s']:.2f}")
    return "\n".join(lines) + "\n"


def cmd_run(a):
    out = os.path.abspath(a.out)
    work = os.path.abspath(a.work)
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    worker = os.path.abspath(a.worker)
    if not os.access(worker, os.X_OK):
        sys.exit(f"error: {worker} is not an executable trainerd-worker")
    threads = a.threads or len(os.sched_getaffinity(0))
    meta = {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "versions": versions(worker), "runs": a.runs, "tokenizers": {}, "parity": {}}
    corpus = os.path.join(work, "corpus.jsonl")
    log(f"corpus: ~{a.corpus_mb} MB into {corpus}")
    meta["corpus"] = make_corpus(corpus, a.corpus_mb, a.seed)
    log(f"  {meta['corpus']}")

    results = []

    def save():
        text = report(results, meta)
        with open(os.path.join(out, "tokenizer-bench.md"), "w") as f:
            f.write(text)
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        return text

    extra = dict(a.extra_tokenizer)
    for name in a.only or ["bytelevel", "sentencepiece"] + list(extra):
        if name in extra or a.tokenizers:
            path = extra.get(name) or os.path.join(a.tokenizers, name, "tokenizer.json")
            info = {"path": path}
            try:
                info["vocab"] = len(json.load(open(path, encoding="utf-8"))["model"]["vocab"])
            except (OSError, KeyError, ValueError):
                pass
        else:
            path, info = train(name, corpus, work, a)
        meta["tokenizers"][name] = info
        info.update(trainerd_startup(worker, path, a.runs))
        ours = {}
        for t in sorted({1, threads}):
            hf_ids = os.path.join(work, f"{name}.hf.{t}.jsonl")
            ours[t] = os.path.join(work, f"{name}.trainerd.{t}.jsonl")
            log(f"{name}, {t} thread(s): HF")
            hf = run_hf(path, corpus, t, a.runs, hf_ids)
            log(f"  {hf}")
            log(f"{name}, {t} thread(s): trainerd")
            td_times = run_trainerd(worker, path, corpus, t, a.runs, ours[t])
            log(f"  {[round(x, 3) for x in td_times]}")
            td_tokens = count_tokens(ours[t])
            info["tokens"] = hf["tokens"]
            bad, examples = compare_ids(ours[t], hf_ids)
            p = meta["parity"].setdefault(name, {"mismatched_lines": 0, "examples": []})
            p["mismatched_lines"] = max(p["mismatched_lines"], bad)
            p["examples"] = p["examples"] or examples
            if td_tokens != hf["tokens"]:
                log(f"  token counts differ: trainerd {td_tokens}, HF {hf['tokens']}")
            results.append({
                "tokenizer": name, "threads": t, "hf_method": hf["method"], "hf_trials": hf["trial_seconds"],
                "hf_encode_s": min(hf["encode_seconds"]), "hf_io_s": min(hf["io_seconds"]),
                "trainerd_s": min(td_times), "hf_tokens": hf["tokens"], "trainerd_tokens": td_tokens,
                "hf_encode_tps": hf["tokens"] / min(hf["encode_seconds"]),
                "hf_io_tps": hf["tokens"] / min(hf["io_seconds"]),
                "trainerd_tps": td_tokens / min(td_times)})
            save()
            os.remove(hf_ids)
        if len(ours) == 2:
            with open(ours[1], "rb") as x, open(ours[threads], "rb") as y:
                diff = sum(1 for l1, l2 in zip(x, y) if l1 != l2)
            meta["parity"][name]["thread_diff_lines"] = diff
        for f in ours.values():
            os.remove(f)
    text = save()
    print(text)
    log(f"wrote {os.path.join(out, 'tokenizer-bench.md')}")
    bad = sum(p["mismatched_lines"] + p.get("thread_diff_lines", 0) for p in meta["parity"].values())
    return 1 if bad else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_hf":  # internal: HF timings in this process
        p = argparse.ArgumentParser(prog="tokenizer_bench.py _hf")
        p.add_argument("--tokenizer", required=True)
        p.add_argument("--corpus", required=True)
        p.add_argument("--runs", type=int, default=3)
        p.add_argument("--ids-out", required=True)
        p.add_argument("--per-line", action="store_true")
        return cmd_hf(p.parse_args(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "_train":  # internal: train one tokenizer
        p = argparse.ArgumentParser(prog="tokenizer_bench.py _train")
        p.add_argument("--kind", required=True, choices=sorted(TRAINERS))
        p.add_argument("--vocab", type=int, required=True)
        p.add_argument("--corpus", required=True)
        p.add_argument("--train-mb", type=float, required=True)
        p.add_argument("--seed", type=int, default=1234)
        p.add_argument("--output", required=True)
        return cmd_train(p.parse_args(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", default=os.path.join(REPO, "build", "worker", "trainerd-worker"),
                   help="the trainerd-worker binary")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/bench-tokenizer",
                   help="where tokenizer-bench.md and results.json go ($OUT or /tmp/bench-tokenizer)")
    p.add_argument("--work", default="/tmp/bench-tokenizer-work", help="corpus, tokenizers, outputs")
    p.add_argument("--corpus-mb", type=float, default=32, help="corpus size in MB of text")
    p.add_argument("--runs", type=int, default=3, help="runs of each measurement; the best counts")
    p.add_argument("--threads", type=int, default=0, help="the many-thread count (default: usable cores)")
    p.add_argument("--tokenizers", help="use DIR/{bytelevel,sentencepiece}/tokenizer.json, no training")
    p.add_argument("--extra-tokenizer", action="append", default=[], metavar="NAME=PATH",
                   help="also measure an existing tokenizer.json (or a folder holding one) under NAME; "
                        "repeatable, e.g. llama3-real=.gpu-run/llama3/tokenizer.json")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="measure only this tokenizer (bytelevel, sentencepiece or an --extra-tokenizer NAME); "
                        "repeatable")
    p.add_argument("--train-mb", type=float, default=12, help="MB of the corpus to train tokenizers on")
    p.add_argument("--train-timeout", type=float, default=100,
                   help="seconds for the big byte-level training before falling back to 32K")
    p.add_argument("--bytelevel-vocab", type=int, default=128000)
    p.add_argument("--sentencepiece-vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    extra = []
    for item in a.extra_tokenizer:
        name, sep, path = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or not path:
            p.error(f"--extra-tokenizer {item!r}: expected NAME=PATH, NAME of letters, digits, '.', '_', '-'")
        if name in ("bytelevel", "sentencepiece") or name in dict(extra):
            p.error(f"--extra-tokenizer {item!r}: the name {name!r} is taken")
        path = os.path.abspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            p.error(f"--extra-tokenizer {item!r}: {path} is not a file")
        extra.append((name, path))
    a.extra_tokenizer = extra
    for name in a.only or []:
        if name not in ["bytelevel", "sentencepiece"] + [n for n, _ in extra]:
            p.error(f"--only {name!r}: not bytelevel, sentencepiece or an --extra-tokenizer NAME")
    return cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
