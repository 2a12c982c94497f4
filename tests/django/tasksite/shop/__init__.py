"""The task site's app: one scheduled task, and the fault hook."""
