"""Migrations: the runs table of database backends."""
