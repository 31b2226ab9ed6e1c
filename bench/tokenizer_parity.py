"""radixd's tokenizer for a GGUF file against llama.cpp's on the same file: token ids for a few hundred
strings (llama-server's POST /tokenize, special tokens parsed), with and without BOS, and decoding.

The strings: lines of this repository's docs and sources, multilingual text, whitespace runs, digits,
characters that need byte fallback, and the vocabulary's own control tokens inside text, mixed at
random (seeded). Prints one table row per check and the first disagreements.

    .venv/bin/python bench/tokenizer_parity.py --llama-server DIR/llama/build/bin/llama-server \\
        --model DIR/gemma-3-270m-q4_k_m.gguf --strings 400
"""

from __future__ import annotations

import argparse
import random
import subprocess
import time
import urllib.request
from pathlib import Path

import benchkit
from llama_server import free_port, post, require_binary

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = [
    "héllo wörld, ça va? naïve café",
    "世界你好，今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "Привет, как дела?",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "emoji 🎉🚀👩‍👩‍👧‍👦🏳️‍🌈",
    "math ∮ E⋅da = Q, ∀x∈ℝ: x² ≥ 0",
    "rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 \u0000\u0007\u007f",
    "def f(x):\n    return x ** 2  # square\n",
    '{"key": [1, 2.5, -3e10], "nested": {"a": null}}',
    "3.14159 2718281828 1,000,000 0x1F 007",
]
SPACES = [" ", "  ", "   ", "    ", "\t", "\n", "\n\n", " \n", "\r\n", "        ", " " * 33, "\n" * 40]


def corpus_lines(limit: int) -> list[str]:
    """Non-empty lines of the repository's docs and daemon sources."""
    lines: list[str] = []
    for pattern in ("README.md", "docs/*.md", "daemon/**/*.py"):
        for path in sorted(ROOT.glob(pattern)):
            lines += [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    rng = random.Random(1)
    rng.shuffle(lines)
    return lines[:limit]


def strings(count: int, specials: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = corpus_lines(count)
    out = list(SAMPLES) + SPACES
    out += [s + "word" for s in SPACES] + ["word" + s for s in SPACES]
    while len(out) < count:
        kind = rng.randrange(3)
        if kind == 0 and lines:
            out.append(lines[len(out) % len(lines)])
        else:
            pool = SAMPLES + lines[:50] + (specials if kind == 2 else [])
            parts = [rng.choice(pool) for _ in range(rng.randint(1, 4))]
            out.append("".join(p + rng.choice(SPACES + [""] * 6) for p in parts))
    return out[:count]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="path of llama.cpp's llama-server binary")
    ap.add_argument("--model", default=None, help="GGUF file (default: the embedded model)")
    ap.add_argument("--strings", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=5, help="disagreements to print")
    args = ap.parse_args()
    require_binary(args.llama_server)
    model = args.model or benchkit.default_model_path()
    gguf_file = benchkit.gguf_file_module
    began = time.perf_counter()
    tok = gguf_file._tokenizer(gguf_file._open(model), model)
    built = time.perf_counter() - began
    added = [t.content for t in tok.tokenizer.get_added_tokens_decoder().values() if t.special]
    # the turn markers and the like, plus a few of the many placeholders (<unused0>...)
    specials = [t for t in added if "unused" not in t][:40] + [t for t in added if "unused" in t][:5]
    texts = strings(args.strings, specials, args.seed)
    port = free_port()
    cmd = [args.llama_server, "-m", model, "--port", str(port), "-t", "1", "-c", "256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited with {proc.returncode} on {model}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        same = same_bos = same_text = 0
        shown: list[str] = []
        for text in texts:
            ours = tok.encode(text, add_special_tokens=False)
            theirs = post(base + "/tokenize", {"content": text, "add_special": False})["tokens"]
            same += ours == theirs
            with_bos = post(base + "/tokenize", {"content": text, "add_special": True})["tokens"]
            same_bos += tok.encode(text) == with_bos
            # Decoded from BOS on: llama-server's /detokenize keeps the space-prefix "▁" of the first
            # piece, where radixd (as transformers) drops it from the start of a decoded text.
            detok = post(base + "/detokenize", {"tokens": with_bos})["content"]
            same_text += tok.decode(with_bos) == detok
            if ours != theirs and len(shown) < args.show:
                at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), 0)
                pieces = [[tok.id_to_token(i) for i in ids[at : at + 6]] for ids in (ours, theirs)]
                shown.append(f"{text!r} at token {at}: radixd {pieces[0]} llama.cpp {pieces[1]}")
    finally:
        proc.kill()
        proc.wait()
    n = len(texts)
    print(f"\n{Path(model).name}: vocabulary {tok.vocab_size}, radixd's tokenizer built in {built:.1f} s")
    print("\n| check | strings | radixd == llama.cpp |")
    print("|---|---:|---:|")
    print(f"| token ids | {n} | {same} ({100 * same / n:.1f} %) |")
    print(f"| token ids with BOS (add_special) | {n} | {same_bos} ({100 * same_bos / n:.1f} %) |")
    print(f"| decode of llama.cpp's ids (from BOS) | {n} | {same_text} ({100 * same_text / n:.1f} %) |")
    for line in shown:
        print(line)


if __name__ == "__main__":
    main()
