"""``python -m pyro_sgmcmc``: the ``pyro-sgmcmc`` command line (see
:mod:`pyro_sgmcmc.cli.commands`)."""

import sys

from .cli.commands import main

# guarded: `compare --jobs` starts its workers with `spawn`, which imports this module again
if __name__ == "__main__":
    sys.exit(main())
