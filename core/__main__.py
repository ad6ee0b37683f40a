"""``python -m failslow``: the ``failslow`` command, for environments whose scripts folder is
not on ``PATH`` (a bare virtualenv, a container image run with ``python``)."""

import sys

from failslow.cli import main

sys.exit(main())
