"""Tests of the APScheduler 3 adapter (anarchon_apscheduler)."""
