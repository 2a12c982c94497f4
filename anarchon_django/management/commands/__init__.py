"""``manage.py anarchon``."""
