"""parse_address / format_address: the one set of rules for every host:port the project reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger.address import Address, AddressError, format_address, parse_address, socket_address
from dledger.broker.config import check_host_port
from dledger.config import ConfigError, Peer, format_peers, parse_peers
from dledger.controller.client import parse_controllers


@pytest.mark.parametrize(("text", "host", "port"), [
    ("127.0.0.1:20911", "127.0.0.1", 20911),
    ("localhost:1", "localhost", 1),
    ("node-1.example.com:65535", "node-1.example.com", 65535),
    ("my_container:9000", "my_container", 9000),
    ("[::1]:9000", "::1", 9000),
    ("[::]:9000", "::", 9000),
    ("[fe80::1%eth0]:9000", "fe80::1%eth0", 9000),
    ("[::ffff:127.0.0.1]:9000", "::ffff:127.0.0.1", 9000),
    ("[2001:db8::a:b]:443", "2001:db8::a:b", 443),
])
def test_accepted_forms(text: str, host: str, port: int) -> None:
    addr = parse_address(text)
    assert addr == Address(host, port)
    assert str(addr) == text == format_address(host, port)


@pytest.mark.parametrize(("text", "why"), [
    ("127.0.0.1", "no port"),
    ("localhost", "no port"),
    ("[::1]", "no port"),
    ("[::1]9000", "no port"),
    (":9000", "no host"),
    ("host:", "not a number"),
    ("host:x1", "not a number"),
    ("host:+80", "not a number"),
    ("host: 80", "not a number"),
    ("host:0", "out of range"),
    ("host:65536", "out of range"),
    ("host:99999", "out of range"),
    ("host:123456", "out of range"),
    ("::1:9000", "needs brackets"),
    ("fe80::1:9000", "needs brackets"),
    ("[::1:9000", "without its ']'"),
    ("[localhost]:9000", "not an IPv6 address"),
    ("[127.0.0.1]:9000", "not an IPv6 address"),
    ("[]:9000", "not an IPv6 address"),
    ("a b:9000", "not a hostname"),
    ("a;b:9000", "not a hostname"),
    ("a|b:9000", "not a hostname"),
    ("", "no port"),
])
def test_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(AddressError, match=why) as e:
        parse_address(text, "--listen")
    assert str(e.value).startswith("--listen ")


def test_not_text() -> None:
    with pytest.raises(AddressError):
        parse_address(9000)  # type: ignore[arg-type]


@given(st.ip_addresses(), st.integers(1, 65535))
def test_format_then_parse_round_trips(ip: object, port: int) -> None:
    host = str(ip)
    assert parse_address(format_address(host, port)) == (host, port)


def test_socket_names() -> None:
    assert socket_address(("127.0.0.1", 80)) == "127.0.0.1:80"
    assert socket_address(("::1", 80, 0, 0)) == "[::1]:80"
    assert socket_address("/tmp/sock") == "/tmp/sock"


def test_peers_strings_take_ipv6_members() -> None:
    peers = parse_peers("n0-[::1]:20911;n1-127.0.0.1:20912;n2-host-a.example:20913")
    assert peers["n0"] == Peer("n0", "::1", 20911)
    assert peers["n0"].address == "[::1]:20911"
    assert peers["n2"].host == "host-a.example"
    assert format_peers(peers) == "n0-[::1]:20911;n1-127.0.0.1:20912;n2-host-a.example:20913"


@pytest.mark.parametrize("text", ["n0-::1:20911", "n0-[::1]", "n0-127.0.0.1:0", "n0127.0.0.1:1", "n$-h:1", "-h:1"])
def test_bad_peers(text: str) -> None:
    with pytest.raises(ConfigError, match="bad peer"):
        parse_peers(text)


def test_broker_and_controller_addresses() -> None:
    assert check_host_port("--listen", "[::1]:9000") == "[::1]:9000"
    with pytest.raises(ConfigError, match="needs brackets"):
        check_host_port("--listen", "::1:9000")
    assert parse_controllers("[::1]:9000;127.0.0.1:9001") == ["[::1]:9000", "127.0.0.1:9001"]
    assert parse_controllers("c0-[::1]:9000;c1-[::1]:9001") == ["[::1]:9000", "[::1]:9001"]
    with pytest.raises(ConfigError, match="out of range"):
        parse_controllers("[::1]:70000")
