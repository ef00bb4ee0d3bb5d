"""An app on a local stack: the one way tests, benchmarks and scripts build one."""
from flask import Flask

from devstack.services import Stack
from main import FEATURES, create_app


def app_on(stack: Stack, *, task_queue=None, testing: bool = True, features_list=FEATURES, **env: str) -> Flask:
    """The app on `stack`'s emulator and cache, its settings read from the stack's environment plus `env` (e.g.
    SECRET_KEY, DATASTORE_NAMESPACE, GAE_ENV). `task_queue` as create_app takes it; `features_list` a part of the
    app's features."""
    return create_app(stack.settings(**env), task_queue=task_queue, features_list=features_list, TESTING=testing)
