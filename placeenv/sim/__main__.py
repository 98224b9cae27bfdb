"""``python -m placeenv.sim env [--devices N]``: export lines for a shell; ``build``: compile only."""

from __future__ import annotations

import argparse
import shlex
import sys

from . import DEFAULT_DEVICES, SimSetupError, build, environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m placeenv.sim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser("env", help="print `export` lines that give Paddle N sim devices")
    env.add_argument("--devices", type=int, default=DEFAULT_DEVICES)
    commands.add_parser("build", help="compile the plugin and print its directory")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build())
        else:
            for key, value in environment(args.devices).items():
                print(f"export {key}={shlex.quote(value)}")
    except SimSetupError as exc:
        print(f"placeenv.sim: error: {exc}", file=sys.stderr)
        if args.command == "env" and not sys.stdout.isatty():
            # Captured by `eval "$(...)"`: make the eval fail too, instead of setting nothing quietly.
            print("false  # placeenv.sim env failed: see the error above")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
