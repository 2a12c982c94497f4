"""A project's own ``manage.py test`` with anarchon installed and Django's defaults.

A SQLite database with no ``TEST`` ``NAME`` becomes an in-memory database under the test
runner. anarchon cannot use that one (its own connection would not see it), but the
project's tests that do not use the scheduler must still run: the check is a warning
(``anarchon.W005``), and only using the scheduler raises, with the same advice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

SETTINGS = """
SECRET_KEY = "test"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "anarchon_django",
                  "proj"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
USE_TZ = True
"""
TESTS = """
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase

import anarchon_django


class PlainTests(TestCase):
    def test_without_the_scheduler(self):
        self.assertEqual(1 + 1, 2)


class SchedulerTests(TestCase):
    def test_the_scheduler_says_what_to_change(self):
        with self.assertRaisesRegex(ImproperlyConfigured, r"in-memory.*TEST NAME.*anarchon\\.W005"):
            anarchon_django.get_scheduler()
"""
JOBS = """
import anarchon_django


@anarchon_django.every("proj.tick", "1h")
def tick(ctx):
    pass
"""


def test_manage_py_test_runs_with_an_in_memory_test_database(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "__init__.py").write_text("")
    (project / "settings.py").write_text(SETTINGS)
    (project / "tests.py").write_text(textwrap.dedent(TESTS))
    (project / "jobs.py").write_text(JOBS)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "proj.settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "django", "test", "proj", "-v", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=90, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Ran 2 tests" in output
    assert "anarchon.W005" in output  # shown once, as a warning
    assert "SystemCheckError" not in output
