"""``python -m linred``: the same as the ``linred`` command."""

import sys

from linred.cli import main

sys.exit(main())
