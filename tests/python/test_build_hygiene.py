"""Building, testing and the demo stay inside the tree: only `make develop` may point the user's
site-packages at it (a second clone built for a test must not redirect every `import nikki`)."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["build", "test", "demo"])
def test_make_targets_do_not_touch_site_packages(target):
    # A dry run lists every command the target would run, without running any.
    plan = subprocess.run(["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True, check=True).stdout
    assert "develop.sh" not in plan
    assert "site-packages" not in plan and "--user" not in plan


def test_make_develop_is_the_explicit_opt_in():
    plan = subprocess.run(["make", "-n", "-C", str(ROOT), "develop"], capture_output=True, text=True, check=True).stdout
    assert "scripts/develop.sh" in plan
