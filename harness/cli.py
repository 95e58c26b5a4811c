"""``python -m harness``: the command line.

Each subcommand lives in its own module of ``harness/commands/`` exposing ``add_arguments(parser)``
and ``main(args) -> int``; this file only wires them, so ``--help`` lists exactly what exists.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "run": ("harness.commands.run", "main job: oracle self-checks, then every backend that runs here on the presets"),
    "golden": ("harness.commands.golden", "check or regenerate the golden store (golden/)"),
    "bench": ("harness.commands.bench", "benchmark backends on a preset: markdown, JSON and PNG reports"),
    "compare": ("harness.commands.compare", "compare two benchmark JSON files, spread-aware verdict per case"),
    "accept": ("harness.commands.accept", "vendor-kernel acceptance check of MODULE:CALLABLE"),
    "fuzz": ("harness.commands.fuzz", "random edge cases inside each backend's support, checked against the oracle"),
    "shrink": ("harness.commands.shrink", "shrink a failing case; write a standalone reproduction script"),
    "audit": ("harness.commands.audit", "check published benchmark claims: consistency, physics, measurement"),
}


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``chosen``'s module is imported (others may pull in heavy optional deps)."""
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="Reference test harness for attention kernels (FP64 oracle, tolerance engine, adapters, timing).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in SUBCOMMANDS.items():
        if not _available(module):
            continue  # not built yet: not listed
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return int(args._module.main(args) or 0)


def entry() -> int:
    """``python -m harness`` and the ``attn-harness`` script: :func:`main`, and a Ctrl-C that reaches this level
    (one during start-up, while torch imports; or in a command that writes no report) one line and exit status
    130 instead of a traceback. The commands that write reports (run, bench, fuzz, accept) turn an interrupt into a
    report of what finished themselves."""
    try:
        return main()
    except KeyboardInterrupt:
        print("python -m harness: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(entry())
