"""``python -m flexibuff_envs`` is the ``flexibuff-envs`` command."""

import sys

from flexibuff_envs.cli import main

sys.exit(main())
