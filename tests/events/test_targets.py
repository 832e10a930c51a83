"""The webhook SSRF guard, with the cases of shared/reference/hostile-inputs.md section 5.

Resolution is exercised with the real resolver (``localhost`` from /etc/hosts) and, for
answers no real name gives here (a public and a private address at once, a rebinding), with
``socket.getaddrinfo`` replaced: no test sends a packet off this machine.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shamal.errors import InvalidParameter, ServiceUnavailable
from shamal.events._targets import (
    ALLOW_PRIVATE_SETTING,
    check_webhook_url,
    is_public_address,
    resolve_public,
)

# Every one of these reaches this machine, its cloud's metadata or a private network.
PRIVATE_TARGETS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://100.100.100.200/",
    "http://127.0.0.1:5432/",
    "http://127.0.0.1./",
    "http://localhost/",
    "http://localhost./",
    "http://LOCALHOST:8080/",
    "http://api.localhost/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://printer.local/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[2002:7f00:1::]/",  # 6to4 around 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 around 169.254.169.254
    "http://[fe80::1]/",
    "http://[::]/",
    "http://0.0.0.0/",
    "http://10.0.0.1/",
    "http://192.168.0.1/",
    "http://172.16.0.1/",
    "http://172.31.255.255/",
    "http://224.0.0.1/",  # multicast
    "http://[ff02::1]/",
    "http://240.0.0.1/",  # reserved
    "http://255.255.255.255/",
    "https://127.0.0.1:443/",
]

# Legacy numeric spellings: refused whatever the operator allows, since parsers disagree.
LEGACY_SPELLINGS = [
    "http://0/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://017700000001/",
    "http://127.1/",
    "http://0x7f.1/",
    "http://0177.0.0.1/",
    "http://127.000.000.001/",
    "http://0x08.0x08.0x08.0x08/",  # 8.8.8.8, public, still refused
    "http://134744072/",  # 8.8.8.8 as one number
    "http://1.2.3.4.5/",
    "http://example.123/",
    "http://%31%32%37.0.0.1/",
]

# Wrong shape: refused whatever the operator allows.
MALFORMED = [
    "",
    "file:///etc/passwd",
    "file://",
    "gopher://127.0.0.1:6379/_SET",
    "dict://127.0.0.1:11211/",
    "ftp://example.com/",
    "jar:file:///x!/",
    "javascript:alert(1)",
    "http://user@127.0.0.1/",
    "http://user:pw@hooks.example.com/",
    "http://good.example@127.0.0.1/",
    "http://127.0.0.1#@good.example/",
    "http://hooks.example.com/a#frag",
    "http://hooks.example.com\\@127.0.0.1/",
    "http://hooks.example.com/a\r\nX-Injected: 1",
    "http://hooks.example.com/a\x00",
    "http://hooks.example.com/a b",
    " http://hooks.example.com/",
    "http:///path",
    "http://:80/",
    "http://hooks.example.com:0/",
    "http://hooks.example.com:99999/",
    "http://hooks.example.com:port/",
    "http://[::1/",
    "http://[fe80::1%25eth0]/",
    "http://\uff11\uff12\uff17.0.0.1/",  # fullwidth digits: NFKC makes 127.0.0.1
    "http://xn--bcher-kva.example/\u00e9",
    "http://-bad.example/",
    "http://bad_.example..com/",
    "http://" + "a" * 64 + ".example/",
    "https://hooks.example.com/" + "a" * 2030,
]


@pytest.mark.parametrize("url", PRIVATE_TARGETS)
def test_private_targets_refused_with_the_operators_way_out(url: str) -> None:
    with pytest.raises(InvalidParameter) as caught:
        check_webhook_url(url, allow_private=False)
    assert ALLOW_PRIVATE_SETTING in caught.value.message
    assert ALLOW_PRIVATE_SETTING == "SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS"


@pytest.mark.parametrize("url", PRIVATE_TARGETS)
def test_private_targets_allowed_by_the_operator(url: str) -> None:
    normal = check_webhook_url(url, allow_private=True)
    assert normal == check_webhook_url(normal, allow_private=True)  # a fixed point


@pytest.mark.parametrize("url", LEGACY_SPELLINGS + MALFORMED)
@pytest.mark.parametrize("allow_private", [False, True])
def test_malformed_and_legacy_refused_always(url: str, allow_private: bool) -> None:
    with pytest.raises(InvalidParameter) as caught:
        check_webhook_url(url, allow_private=allow_private)
    # The message never repeats what the caller sent (it may hold a password or garbage).
    assert url.strip() not in caught.value.message or not url.strip()
    assert "pw" not in caught.value.message


def test_legacy_spelling_of_a_private_address_names_the_setting() -> None:
    with pytest.raises(InvalidParameter, match=ALLOW_PRIVATE_SETTING):
        check_webhook_url("http://2130706433/", allow_private=False)


def test_non_string_refused() -> None:
    with pytest.raises(InvalidParameter):
        check_webhook_url(None, allow_private=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("https://hooks.example.com/x?y=1", "https://hooks.example.com/x?y=1"),
        ("HTTPS://Hooks.Example.COM:443/a", "https://hooks.example.com/a"),
        ("http://hooks.example.com:80", "http://hooks.example.com/"),
        ("http://hooks.example.com.:8080/p", "http://hooks.example.com:8080/p"),
        ("http://8.8.8.8", "http://8.8.8.8/"),
        ("https://[2606:4700:4700:0::1111]:8443/h", "https://[2606:4700:4700::1111]:8443/h"),
        ("https://xn--bcher-kva.example/%C3%A9", "https://xn--bcher-kva.example/%C3%A9"),
        ("https://a_b.example/", "https://a_b.example/"),
    ],
)
def test_public_targets_normalized(url: str, normal: str) -> None:
    assert check_webhook_url(url, allow_private=False) == normal


def test_length_limit_is_2048() -> None:
    base = "https://hooks.example.com/"
    assert check_webhook_url(base + "a" * (2048 - len(base)), allow_private=False)
    with pytest.raises(InvalidParameter, match="2048"):
        check_webhook_url(base + "a" * (2049 - len(base)), allow_private=False)


# ---------------------------------------------------------------- property tests
PRIVATE_V4 = [
    ipaddress.IPv4Network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "0.0.0.0/8",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
]


@st.composite
def private_v4(draw: Callable[..., Any]) -> ipaddress.IPv4Address:
    network: ipaddress.IPv4Network = draw(st.sampled_from(PRIVATE_V4))
    offset: int = draw(st.integers(0, network.num_addresses - 1))
    return network[offset]


@given(address=private_v4())
def test_any_private_ipv4_refused_in_every_spelling(address: ipaddress.IPv4Address) -> None:
    number = int(address)
    spellings = [
        f"http://{address}/",
        f"http://[::ffff:{address}]/",
        f"http://{number}/",
        f"http://{number:#x}/",
        f"http://0{number:o}/",
        "http://" + ".".join(f"{octet:#x}" for octet in address.packed) + "/",
        f"http://[2002:{number >> 16:x}:{number & 0xFFFF:x}::]/",
        f"http://[64:ff9b::{number >> 16:x}:{number & 0xFFFF:x}]/",
    ]
    for url in spellings:
        with pytest.raises(InvalidParameter):
            check_webhook_url(url, allow_private=False)
    assert not is_public_address(address)
    assert not is_public_address(ipaddress.IPv6Address(f"::ffff:{address}"))


@given(number=st.integers(0, 2**32 - 1))
def test_one_number_hosts_never_pass(number: int) -> None:
    # Whatever address a lone number means, it is a legacy spelling: refused always.
    for url in (f"http://{number}/", f"http://{number:#x}/"):
        with pytest.raises(InvalidParameter):
            check_webhook_url(url, allow_private=True)


@given(number=st.integers(0, 2**32 - 1))
def test_dotted_quads_follow_is_public(number: int) -> None:
    address = ipaddress.IPv4Address(number)
    url = f"https://{address}/"
    if is_public_address(address):
        assert check_webhook_url(url, allow_private=False) == url
    else:
        with pytest.raises(InvalidParameter):
            check_webhook_url(url, allow_private=False)
    assert check_webhook_url(url, allow_private=True) == url
    assert any(address in network for network in PRIVATE_V4) <= (not is_public_address(address))


# ---------------------------------------------------------------- resolution
Answer = list[tuple[Any, ...]]


def _answers(*addresses: str) -> Answer:
    out: Answer = []
    for text in addresses:
        if ":" in text:
            out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (text, 443, 0, 0)))
        else:
            out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (text, 443)))
    return out


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``socket.getaddrinfo`` answering from a table; ``calls`` records each name asked."""
    table: dict[str, Any] = {"answers": {}, "calls": []}

    def lookup(host: str, port: object, *args: object, **kwargs: object) -> Answer:
        table["calls"].append(host)
        got = table["answers"].get(host)
        if got is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(got)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return table


def test_resolve_public_name(resolver: dict[str, Any]) -> None:
    resolver["answers"]["hooks.example.com"] = _answers("93.184.216.34", "93.184.216.34", "2606::1")
    assert resolve_public("hooks.example.com", 443, allow_private=False) == [
        "93.184.216.34",
        "2606::1",
    ]


@pytest.mark.parametrize("bad", ["127.0.0.1", "169.254.169.254", "10.1.2.3", "::1", "fd00::1"])
def test_any_private_answer_condemns_the_name(resolver: dict[str, Any], bad: str) -> None:
    # A name that was public when stored and answers a private address now: rebinding.
    resolver["answers"]["rebind.example.com"] = _answers("93.184.216.34", bad)
    with pytest.raises(InvalidParameter, match=ALLOW_PRIVATE_SETTING) as caught:
        resolve_public("rebind.example.com", 443, allow_private=False)
    assert bad not in caught.value.message  # no internal DNS oracle
    assert resolve_public("rebind.example.com", 443, allow_private=True)[-1] == bad


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "localhost.", "db.localhost", "metadata.google.internal"]
)
def test_localhost_names_refused_without_asking_dns(resolver: dict[str, Any], host: str) -> None:
    with pytest.raises(InvalidParameter, match=ALLOW_PRIVATE_SETTING):
        resolve_public(host, 80, allow_private=False)
    assert resolver["calls"] == []


@pytest.mark.parametrize(
    ("host", "allowed"),
    [("127.0.0.1", "127.0.0.1"), ("[::1]", "::1"), ("::ffff:127.0.0.1", "::ffff:7f00:1")],
)
def test_literals_need_no_resolver(resolver: dict[str, Any], host: str, allowed: str) -> None:
    with pytest.raises(InvalidParameter):
        resolve_public(host, 80, allow_private=False)
    assert resolve_public(host, 80, allow_private=True) == [allowed]
    assert resolver["calls"] == []


def test_public_literal(resolver: dict[str, Any]) -> None:
    assert resolve_public("8.8.8.8", 443, allow_private=False) == ["8.8.8.8"]
    assert resolver["calls"] == []


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "127.1", "a b", "", "[]", "%31.2"])
def test_resolve_refuses_what_the_url_check_refuses(resolver: dict[str, Any], host: str) -> None:
    with pytest.raises(InvalidParameter):
        resolve_public(host, 80, allow_private=True)
    assert resolver["calls"] == []


def test_unknown_name_is_unavailable_not_invalid(resolver: dict[str, Any]) -> None:
    with pytest.raises(ServiceUnavailable):
        resolve_public("nowhere.example.com", 443, allow_private=False)


def test_real_resolver_localhost_when_allowed() -> None:
    found = resolve_public("localhost", 80, allow_private=True)
    assert found
    assert all(ipaddress.ip_address(a).is_loopback for a in found)
