"""``python -m kvtier``: the ``kvtier`` command line (same as the console script)."""

import sys

from kvtier.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
