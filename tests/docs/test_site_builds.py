"""`make docs` builds the site with --strict: a broken link or anchor, or a page left out of
the nav, is a warning and fails the build. The same build, into a temporary folder."""

import os
import subprocess
import sys

from tests.helpers.paths import REPO


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
