"""``python -m anarchon_core`` is the ``anarchon`` command."""

import sys

from .cli.main import main

sys.exit(main())
