"""Debian's Chromium driven by Playwright, for the browser tests and `make screenshots` (never a browser Playwright
downloads: the machine has no internet for it)."""
from devstack.services import debian_binary

CHROMIUM = "/usr/bin/chromium"
# Headless as root; and nothing that phones home: on a closed network Chromium's background connections fail, many at
# a time, and slow every start.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def launch(playwright):
    """Headless Debian Chromium under Playwright's control (installed from Debian's package when missing, as root)."""
    return playwright.chromium.launch(executable_path=debian_binary(CHROMIUM, "chromium"), headless=True,
                                      args=CHROMIUM_ARGS)
