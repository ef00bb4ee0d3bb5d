"""The accounts the mapper's demo job runs over, for a fresh `make run`."""
from accounts import service
from accounts.models import Account

DEMO_ACCOUNTS = 1_000


def seed() -> bool:
    """The demo's accounts, written directly (no server runs yet when `flask seed` does)."""
    if Account.query().fetch(1, keys_only=True):
        return False
    service.keep_figures()
    for start in range(0, DEMO_ACCOUNTS, service.SEED_BATCH):
        service.seed_batch({"seed": "demo", "start": start, "stop": min(start + service.SEED_BATCH, DEMO_ACCOUNTS)})
    return True
