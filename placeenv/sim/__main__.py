"""``python -m placeenv.sim env [--devices N]``: export lines for a shell; ``build``: compile only."""

from __future__ import annotations

import argparse
import shlex
import sys

from . import DEFAULT_DEVICES, MAX_DEVICES, SimSetupError, build, environment

# The usual mistake: `python` is not the virtualenv's, finds no Paddle, and the eval sets nothing.
WHICH_PYTHON = ("Run it with the Python that has placeenv and Paddle installed, e.g. a virtualenv's: "
                'eval "$(.venv/bin/python -m placeenv.sim env --devices 4)"')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m placeenv.sim", epilog=WHICH_PYTHON,
        description="Sim devices: N Paddle devices sim:0 ... sim:N-1 on a machine without an accelerator.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser(
        "env", help="print the export lines that give Paddle N sim devices, for eval in a shell",
        description="Print the export lines that give Paddle N sim devices (building the plugin if needed), "
        "for eval in a shell before Paddle starts.", epilog=WHICH_PYTHON,
    )
    env.add_argument("--devices", type=int, default=DEFAULT_DEVICES, metavar="N",
                     help=f"how many sim devices, 1 to {MAX_DEVICES} (default: {DEFAULT_DEVICES})")
    env.add_argument("--transfer-us", type=int, metavar="US",
                     help="device time of every transfer, the fixed term, in µs "
                     "(default: $PLACEENV_SIM_TRANSFER_US, else 0: off)")
    env.add_argument("--gbps", type=float, metavar="GB/S",
                     help="device bandwidth of the per-byte term, in GB/s (default: $PLACEENV_SIM_GBPS, else 0: off)")
    commands.add_parser("build", help="compile the plugin and print its directory",
                        description="Compile the plugin (cached by content hash) and print its directory.",
                        epilog=WHICH_PYTHON)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build())
        else:
            for key, value in environment(args.devices, args.transfer_us, args.gbps).items():
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
