"""``python -m harness accept``: the vendor-kernel acceptance check, one command, one verdict.

The options are read here; the check itself (a judge process that never imports the candidate,
children that run it) is :mod:`harness.accept`. Exit status: 0 accepted, 1 rejected or incomplete,
2 usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.accept import DEFAULT_OUT, DEFAULT_PROFILE
from harness.accept import main as run_acceptance
from harness.accept.isolation import DEFAULT_TIMEOUT_S
from harness.accept.profiles import PROFILES


def _dtypes(text: str) -> list[str]:
    from harness.cases import DTYPES

    names = [t for t in text.replace(",", " ").split() if t]
    bad = [t for t in names if t not in DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {', '.join(bad) or text!r}; known: {', '.join(DTYPES)}")
    return names


def _positive(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return v

    return parse


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--impl", metavar="MODULE:CALLABLE",
                        help="the implementation: a callable importable from the current directory (required)")
    parser.add_argument("--family", choices=("softmax", "linear", "decode"), default="softmax",
                        help="softmax (flash-attn's signature, default), linear (FLA's) or decode (flash-attn's "
                             "flash_attn_with_kvcache)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available, else cpu (cpu selects the profile's CPU-sized variant)")
    parser.add_argument("--dtypes", type=_dtypes, default=None, metavar="DTYPES",
                        help="replace the profile's dtypes, e.g. 'bf16,fp16' or 'bf16 fp16' (quoted)")
    parser.add_argument("--profile", choices=tuple(PROFILES), default=DEFAULT_PROFILE,
                        help=f"what must work (default {DEFAULT_PROFILE}); see --list")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"report directory (default {DEFAULT_OUT}/)")
    parser.add_argument("--case", action="append", default=None, metavar="CASE_ID",
                        help="run only this case id (repeatable): replaying a failure")
    parser.add_argument("--seed", type=_seed, default=None,
                        help="run only this seed per case (replaying a failure; the anti-cheat seeds derive from it)")
    parser.add_argument("--base-seed", type=_seed, default=None,
                        help="seeds are base, base+1, ...: reproduce a whole run (default: drawn fresh, in the report)")
    parser.add_argument("--seeds", type=_positive(int), default=None, help="seeds per case (default: the profile's)")
    parser.add_argument("--timeout", type=_positive(float), default=DEFAULT_TIMEOUT_S,
                        help=f"seconds per case before the child is killed as hung (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--jobs", type=_positive(int), default=1,
                        help="cases run in parallel (default 1; the speed section always runs alone)")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed section (CUDA)")
    parser.add_argument("--speed", action="store_true",
                        help="run the speed section on a CPU too (host time, the CPU profile's small bench cases: a dry run)")
    parser.add_argument("--start-method", choices=("forkserver", "spawn"), default=None,
                        help="child processes: spawn (default with --device cuda) or forkserver (default on CPU: fast)")
    parser.add_argument("--list", action="store_true", help="list the profile's cases (after --device) and exit")


def main(args) -> int:
    return run_acceptance(args)
