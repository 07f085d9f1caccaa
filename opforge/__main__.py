"""``python -m opforge``: the command line, as the ``opforge`` script runs it."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
