"""Management commands of anarchon_django."""
