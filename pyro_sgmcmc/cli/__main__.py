"""``python -m pyro_sgmcmc.cli``: the ``pyro-sgmcmc`` command line."""

import sys

from .commands import main

sys.exit(main())
