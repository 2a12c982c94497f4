"""APScheduler 3 integration for anarchon (empty until its own issue lands)."""
