"""The ``anarchon`` command line."""
