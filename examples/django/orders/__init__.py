"""The example shop's orders app, with its scheduled jobs in ``jobs.py``."""
