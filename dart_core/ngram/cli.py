"""The N-gram table command line: ``python -m dart_core.ngram {build,import,info,query}``.

    python -m dart_core.ngram build --tokenizer bundled --out table.dngram corpus.jsonl.gz
    python -m dart_core.ngram info table.dngram --verify
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

import numpy as np

from .build import build_ngram_table, import_original_trie
from .store import NgramFormatError, NgramStore, tokenizer_fingerprint


def load_tokenizer(name: str):
    """The tokenizer ``--tokenizer`` names ('bundled', a directory, a Hub id), loaded as targets are. The command
    line is the one part of ``ngram`` that reaches the model loader: the store and the builder take the tokenizer
    as an argument. Imported here, so ``info`` and ``query`` without a tokenizer do not load torch."""
    from ..models.loader import load_tokenizer as load
    return load(name)


def _cmd_build(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer(args.tokenizer)
    stats = build_ngram_table(args.corpus, args.out, tokenizer, order=args.order, min_count=args.min_count,
                              vocab_size=args.vocab_size, chunk_tokens=args.chunk_tokens, max_docs=args.max_docs, tmp_dir=args.tmp_dir,
                              tokenizer_name=args.tokenizer, command=" ".join(["python -m dart_core.ngram"] + sys.argv[1:]))
    print(json.dumps(stats, indent=2))


def _cmd_import(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    stats = import_original_trie(args.src, args.out, tokenizer, vocab_size=args.vocab_size,
                                 fingerprint=args.fingerprint, min_count=args.min_count, tmp_dir=args.tmp_dir,
                                 command=" ".join(["python -m dart_core.ngram"] + sys.argv[1:]))
    print(json.dumps(stats, indent=2))


def _cmd_info(args: argparse.Namespace) -> None:
    store = NgramStore.open(args.table, verify=False)
    if args.verify:
        store.verify()
    info = store.info()
    if args.verify:
        info["verified"] = True
    if args.json:
        print(json.dumps(info, indent=2))
        return
    meta = info.pop("metadata")
    for k, v in info.items():
        print(f"{k:>16}: {v}")
    print(f"{'metadata':>16}: {json.dumps(meta, indent=2)}")


def _cmd_query(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    store = NgramStore.open(args.table, expected_fingerprint=tokenizer_fingerprint(tokenizer) if tokenizer else None)
    if args.text is not None:
        if tokenizer is None:
            raise ValueError("--text needs --tokenizer")
        context = tokenizer.encode(args.text, add_special_tokens=False)
    else:
        context = args.ids or []
    show = (lambda t: repr(tokenizer.decode([int(t)]))) if tokenizer else str
    print(f"context ids: {context[-(store.order - 1):] if store.order > 1 else []} (last order-1 used)")
    if args.candidates:
        probs, matched = store.query(context, args.candidates)
        for t, p, m in zip(args.candidates, probs, matched):
            print(f"  {int(t):>8} {show(t):<20} P={p:.6f} matched_len={int(m)}")
        return
    m, ctx_count, toks, counts = store.continuations(context)
    if m == 0:
        print("no suffix of the context is in the table")
        return
    print(f"longest matched suffix: {m} tokens, seen {ctx_count} times; top continuations:")
    for i in np.argsort(-counts, kind="stable")[:args.top]:
        print(f"  {int(toks[i]):>8} {show(toks[i]):<20} P={counts[i] / ctx_count:.6f} ({int(counts[i])})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dart_core.ngram", description="N-gram tables for DART: build from a corpus, import an original .trie, inspect, query")
    sub = parser.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="count token n-grams of corpora into a table")
    b.add_argument("--tokenizer", required=True, help="local dir, Hub id, or 'bundled' for the bundled target")
    b.add_argument("--corpus", nargs="+", required=True,
                   help="text (.txt[.gz]) or JSON lines (.jsonl[.gz]: 'response_ids', 'text' or 'response' field); "
                        "PATH@K counts a file K times (a mixture weight)")
    b.add_argument("--order", type=int, default=4, help="n-gram order (1..8); default 4")
    b.add_argument("--min-count", type=int, default=1, help="drop n-grams seen fewer times (and their continuations)")
    b.add_argument("--out", required=True, help="table to write (written atomically)")
    b.add_argument("--chunk-tokens", type=int, default=1 << 23,
                   help="tokens counted in memory before spilling a sorted run (peak RAM ~ order x this x 16 B)")
    b.add_argument("--vocab-size", type=int, default=None,
                   help="ids the table accepts (default: the tokenizer's); give the model's padded vocabulary size "
                        "if its drafter can propose ids past the tokenizer's")
    b.add_argument("--max-docs", type=int, default=None, help="stop after this many documents (for quick tests)")
    b.add_argument("--tmp-dir", default=None, help="where sorted run files go (default: the system temp dir; needs ~order x tokens x 16 B)")
    b.set_defaults(func=_cmd_build)

    i = sub.add_parser("info", help="print a table's header, sizes and build metadata")
    i.add_argument("table")
    i.add_argument("--verify", action="store_true", help="also check the checksum and structure")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_cmd_info)

    q = sub.add_parser("query", help="show P(candidates | context) or the top continuations of a context")
    q.add_argument("table")
    q.add_argument("--tokenizer", help="tokenizer for --text and for printing tokens (also checks the fingerprint)")
    src = q.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="context as text")
    src.add_argument("--ids", type=int, nargs="*", help="context as token ids")
    q.add_argument("--candidates", type=int, nargs="*", help="candidate ids (default: list continuations)")
    q.add_argument("--top", type=int, default=10)
    q.set_defaults(func=_cmd_query)

    im = sub.add_parser("import", help="convert an original DART .trie (streaming) into a table")
    im.add_argument("src")
    im.add_argument("--out", required=True)
    im.add_argument("--tokenizer", help="the tokenizer the .trie was built with (sets vocab size and fingerprint)")
    im.add_argument("--vocab-size", type=int, default=None, help="instead of --tokenizer")
    im.add_argument("--fingerprint", default=None, help="with --vocab-size: fingerprint to record")
    im.add_argument("--min-count", type=int, default=1)
    im.add_argument("--tmp-dir", default=None)
    im.set_defaults(func=_cmd_import)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        args.func(args)
    except (NgramFormatError, FileNotFoundError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
