"""``python -m snapaudit_jax``: the ``snapaudit`` command."""

import sys

from snapaudit_jax.cli import main

sys.exit(main())
