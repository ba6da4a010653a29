"""Headless Chromium, as the tests read a report or a list page (installed by
scripts/setup-system.sh; its absence is a failure, not a skip)."""

import shutil
import subprocess

import pytest


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.fail("chromium is not installed (run scripts/setup-system.sh)")


def browser(*args, tmp_path):
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", "--no-first-run", "--hide-scrollbars",
                           f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)
