"""``python -m pyro_sgmcmc``: the ``pyro-sgmcmc`` command line (see :mod:`pyro_sgmcmc.cli`)."""

import sys

from .cli import main

sys.exit(main())
