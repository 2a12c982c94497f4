"""Migrations of the orders app."""
