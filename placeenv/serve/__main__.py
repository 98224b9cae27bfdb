"""``python -m placeenv.serve``: the service's command (process/cli.py)."""

import sys

from .process.cli import main

if __name__ == "__main__":
    sys.exit(main())
