"""``python -m pyro_sgmcmc.cli``: the ``pyro-sgmcmc`` command line."""

import sys

from .commands import main

# guarded: `compare --jobs` starts its workers with `spawn`, which imports this module again
if __name__ == "__main__":
    sys.exit(main())
