#!/usr/bin/env python
"""Django's command-line utility for the example shop."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a management command (``python manage.py anarchon`` runs the scheduler)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line  # noqa: PLC0415

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
