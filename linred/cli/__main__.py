"""``python -m linred.cli``: the same as the ``linred`` command (and ``python -m linred``)."""

import sys

from linred.cli import main

sys.exit(main())
