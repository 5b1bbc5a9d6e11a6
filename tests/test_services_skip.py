"""A fresh machine without PostgreSQL/Redis: `services` tests skip, naming the service and how to start it."""
import socket

from tests import conftest


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_a_service_that_is_down_gives_a_reason_naming_it_and_how_to_start_it(monkeypatch):
    monkeypatch.setitem(conftest.SERVICES, "Nothing", (_closed_port(), "start-nothing --now"))
    reason = conftest.service_down("Nothing")
    assert reason and "Nothing on 127.0.0.1:" in reason and "start-nothing --now" in reason


def test_a_service_that_listens_is_not_reported_down(monkeypatch):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        monkeypatch.setitem(conftest.SERVICES, "Listening", (srv.getsockname()[1], "-"))
        assert conftest.service_down("Listening") is None
    finally:
        srv.close()


def test_a_test_naming_one_service_skips_only_when_that_one_is_down(monkeypatch):
    import pytest

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        monkeypatch.setattr(conftest, "SERVICES", {"Up": (srv.getsockname()[1], "-"), "Down": (_closed_port(), "-")})

        class Item:
            def __init__(self, mark):
                self.mark = mark

            def get_closest_marker(self, name):
                return self.mark if name == "services" else None

        conftest.pytest_runtest_setup(Item(pytest.mark.services("Up").mark))  # runs: its service is up
        for mark in (pytest.mark.services("Down").mark, pytest.mark.services.mark):  # named down / all needed
            with pytest.raises(pytest.skip.Exception, match="Down on 127.0.0.1"):
                conftest.pytest_runtest_setup(Item(mark))
    finally:
        srv.close()
