"""The Makefile's check of the system tools that `make run` and `make test` need: a tool on
PATH passes quietly; a missing one that apt-get cannot bring stops make with one line that
names the package to install."""

import os
import shutil
import subprocess

import pytest

from tests.helpers.paths import REPO

MAKE = shutil.which("make")


def make(target: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([MAKE, "-s", "-C", str(REPO), target], env={"PATH": path},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("tool", ["redis-server", "npm"])
def test_a_tool_on_path_passes_quietly(tool):
    done = make(f"need-{tool}", os.environ["PATH"])
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""


@pytest.mark.parametrize("tool", ["redis-server", "npm"])
def test_a_missing_tool_that_cannot_be_installed_stops_make_naming_its_package(tool, tmp_path):
    done = make(f"need-{tool}", str(tmp_path))  # nothing on PATH: neither the tool nor apt-get or sudo
    assert done.returncode != 0
    assert done.stderr.splitlines()[0] == f"make: {tool} not found: install the package {tool} (Debian: sudo apt-get install {tool})"
