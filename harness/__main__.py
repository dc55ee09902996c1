"""``python -m harness <command> [args]``: one entry point for the harness's command-line tools.

Each command is one module in ``harness/commands/`` defining ``HELP`` (one line) and
``main(argv) -> int``; adding a command is adding a file there.
"""

from __future__ import annotations

import sys

from harness.commands import available, load


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = available()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m harness <command> [args]\n\ncommands:")
        for name in commands:
            print(f"  {name:<12} {load(name).HELP}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"unknown command {name!r}; commands: {', '.join(commands)}", file=sys.stderr)
        return 2
    return int(load(name).main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
