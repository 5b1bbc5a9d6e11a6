"""Suite-wide test setup.

Test data lives in the repository (`tests/paths.py`); nothing outside the checkout is read. Tests marked
`services` need the PostgreSQL and Redis on 127.0.0.1 (`.ci/run` starts them) and skip, saying which one
and how to start it, when they are down.
"""
import socket
from functools import lru_cache

import pytest
import torch

# On the 2-core CI box a second torch thread only spins; one thread is faster and repeatable.
torch.set_num_threads(1)

SERVICES = {
    "PostgreSQL": (5432, "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"),
    "Redis": (6379, 'redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ""'),
}


@lru_cache(maxsize=None)
def service_down(name: str) -> str | None:
    """A one-line reason when the named service does not accept connections on 127.0.0.1, else None."""
    port, how = SERVICES[name]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as exc:
        return f"{name} on 127.0.0.1:{port} is not reachable ({exc.strerror or exc}); start it with `{how}` or run .ci/run"
    return None


def pytest_runtest_setup(item):
    if (marker := item.get_closest_marker("services")) is not None:
        for name in marker.args or SERVICES:  # @pytest.mark.services("Redis"): that one alone
            if reason := service_down(name):
                pytest.skip(reason)


def pytest_collection_modifyitems(session, config, items):
    """tests/bot/history runs last: its package-scoped Celery worker (the tree-speed fake under its own task
    name) left the shared app in a state that made later bot tests' workers time out when it ran first."""
    items.sort(key=lambda item: "tests/bot/history/" in item.nodeid)
