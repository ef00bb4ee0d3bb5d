"""Debian's Chromium driven by Playwright, for the browser tests and `make screenshots` (never a browser Playwright
downloads: the machine has no internet for it)."""
import os

from devstack.services import DevstackError

CHROMIUM = "/usr/bin/chromium"
# Headless as root; and nothing that phones home: on a closed network Chromium's background connections fail, many at
# a time, and slow every start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def launch(playwright):
    """Headless Debian Chromium under Playwright's control."""
    if not os.access(CHROMIUM, os.X_OK):
        raise DevstackError(f"Chromium is not installed at {CHROMIUM}: `apt-get install chromium` (as root), then again.")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
