"""``python -m pyro_sgmcmc``: the ``pyro-sgmcmc`` command line (see
:mod:`pyro_sgmcmc.cli.commands`)."""

import sys

from .cli.commands import main

sys.exit(main())
