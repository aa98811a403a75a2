"""Build a small byte-level BPE tokenizer from this repository's own Markdown, for load generators.

Third-party load generators (aiperf, inference-perf) count tokens with a Hugging Face tokenizer
and, by default, download the served model's from the hub. With no hub to reach, this script
trains one locally (the `tokenizers` library) on the repository's README and docs/*.md and saves
it as a directory that `transformers.AutoTokenizer.from_pretrained(DIR)` loads offline
(tokenizer.json, tokenizer_config.json, special_tokens_map.json).

It is not the served model's tokenizer: token counts a load generator reports with it are
approximate (the simulated replicas count their own pseudo-tokens, controller/sim/openai_api.py).

Run it with a Python that has `tokenizers` and `transformers` (the load generator's venv, see
tools/loadgen/README.md), not the project's:

    /tmp/lg-venv/bin/python tools/loadgen/build_tokenizer.py /tmp/lg-tokenizer --hf-home /tmp/lg-hf

`--hf-home DIR` also lays the same files out as a Hugging Face hub cache entry
(DIR/hub/models--local--governor-bpe/snapshots/<sha1>/, refs/main), so that a tool run with
HF_HOME=DIR HF_HUB_OFFLINE=1 finds it by the name `local/governor-bpe` (aiperf 0.13.0 in offline
mode looks a tokenizer up in that cache only, and fails on a plain directory path).

Must not: fetch anything, or be imported by the project or its tests (it is a tool, not a module).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def corpus_files(root: Path) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [f for f in files if f.is_file()]


def build(out: Path, vocab_size: int) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = corpus_files(ROOT)
    if not files:
        raise SystemExit(f"build_tokenizer: no Markdown found under {ROOT} (README.md, docs/*.md)")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(f) for f in files], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", model_max_length=8192)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


CACHE_REPO = "local/governor-bpe"


def lay_out_hf_cache(tokenizer_dir: Path, hf_home: Path) -> Path:
    """Copy the tokenizer into HF_HOME's hub cache as CACHE_REPO at revision main; return the snapshot."""
    files = sorted(f for f in tokenizer_dir.iterdir() if f.is_file())
    digest = hashlib.sha1(b"".join(f.read_bytes() for f in files)).hexdigest()
    repo = hf_home / "hub" / ("models--" + CACHE_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / digest
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, snapshot / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(digest)
    return snapshot


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory to write the tokenizer to (created if missing)")
    ap.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary size (default 8000)")
    ap.add_argument("--hf-home", type=Path,
                    help=f"also lay it out as {CACHE_REPO!r} in this HF_HOME's hub cache (for offline mode)")
    args = ap.parse_args(argv)
    if not 300 <= args.vocab_size <= 100_000:
        print(f"build_tokenizer: --vocab-size {args.vocab_size}: expected 300..100000", file=sys.stderr)
        return 2
    out = build(args.out, args.vocab_size)
    from transformers import AutoTokenizer

    check = AutoTokenizer.from_pretrained(str(out))  # what the load generator will do
    sample = "Governor decides replicas, routing and admission every tick."
    ids = check(sample)["input_ids"]
    print(f"{out}: vocabulary {check.vocab_size}, {len(ids)} tokens for {sample!r}")
    if args.hf_home is not None:
        snapshot = lay_out_hf_cache(out, args.hf_home)
        print(f"{snapshot}: {CACHE_REPO} for HF_HOME={args.hf_home} HF_HUB_OFFLINE=1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
