"""``python -m lever``: the ``lever`` command."""

import sys

from lever.cli import main

sys.exit(main())
