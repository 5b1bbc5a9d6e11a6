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
