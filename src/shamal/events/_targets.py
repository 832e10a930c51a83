"""Where a webhook may point: the guard against server-side request forgery.

Two checks, at two times:

- :func:`check_webhook_url`, when a webhook is created or changed: the URL's shape (http or
  https, a host, no user or password, no control characters, at most 2048 characters) and,
  when the host is an IP literal, that the address is public. IPv4 in legacy spellings
  (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``) is refused outright: resolvers and
  URL parsers disagree about what those mean, so no check of one reading is safe.
- :func:`resolve_public`, at every delivery: resolve the host and refuse if *any* address is
  not public, so a name that answered a public address when it was created and answers
  ``169.254.169.254`` now (DNS rebinding) is caught. The sender connects to an address this
  returned, never resolving again.

"Public" follows IANA's special-purpose registries via :mod:`ipaddress` (``is_global``),
after unwrapping IPv6 forms that carry an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``,
6to4 ``2002::/16``, NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48``), and never multicast.
So loopback, link-local (the cloud metadata address ``169.254.169.254`` and ``fe80::/10``),
private (``10/8``, ``172.16/12``, ``192.168/16``, ``fc00::/7``, which holds AWS's
``fd00:ec2::254``), shared address space (``100.64/10``, Alibaba's ``100.100.100.200``),
unspecified, reserved and documentation ranges are all refused. MLflow's guard
(``mlflow/utils/validation.py``, ``mlflow/webhooks/ssrf.py``) draws the same line; it checks
the connected peer instead of pinning the address, which needs urllib3 internals.

An operator who runs receivers on a private network sets
``SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS=true``; then only the URL's shape is checked.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from shamal.errors import InvalidParameter, ServiceUnavailable

__all__ = [
    "ALLOW_PRIVATE_SETTING",
    "MAX_URL_LENGTH",
    "check_webhook_url",
    "is_public_address",
    "resolve_public",
]

logger = logging.getLogger(__name__)

ALLOW_PRIVATE_SETTING = "SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS"
MAX_URL_LENGTH = 2048

_SCHEMES = {"http": 80, "https": 443}
_NAT64 = (
    ipaddress.IPv6Network("64:ff9b::/96"),  # RFC 6052, well-known prefix
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # RFC 8215, local-use prefix
)
# Names that mean this machine or a private network whatever DNS says (RFC 6761, RFC 8375,
# ICANN's 2024 reservation of .internal, mDNS's .local).
_PRIVATE_SUFFIXES = ("localhost", "localdomain", "local", "internal", "home.arpa")
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _private_refusal(what: str) -> InvalidParameter:
    return InvalidParameter(
        f"webhook target refused: {what}; an operator can allow private targets with "
        f"{ALLOW_PRIVATE_SETTING}=true"
    )


def _embedded_ipv4(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if any(address in network for network in _NAT64):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def is_public_address(address: Address) -> bool:
    """Whether a webhook may be sent to ``address`` without the operator's consent.

    True only for globally routable unicast addresses, judged on the IPv4 address an IPv6
    transition form carries (so ``::ffff:127.0.0.1`` is loopback).
    """
    inner = _embedded_ipv4(address)
    return inner.is_global and not inner.is_multicast and not address.is_multicast


def _parse_ipv4_part(part: str) -> int | None:
    # inet_aton's reading: 0x.. hex, a leading 0 octal, else decimal.
    try:
        if part[:2].lower() == "0x":
            return int(part[2:] or "0", 16)
        if len(part) > 1 and part.startswith("0"):
            return int(part[1:], 8)
        return int(part, 10)
    except ValueError:
        return None


def _legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """What inet_aton (and WHATWG's URL parser) make of a numeric host, or None."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or any(not p or not p.isascii() for p in parts):
        return None
    numbers = [_parse_ipv4_part(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    *front, last = values
    if any(n > 255 for n in front) or last >= 256 ** (5 - len(values)):
        return None
    total = last
    for index, number in enumerate(front):
        total += number << (8 * (3 - index))
    return ipaddress.IPv4Address(total)


def _ends_in_number(host: str) -> bool:
    # WHATWG URL: a host whose last label is a number is an IPv4 address or invalid.
    last = host.rsplit(".", 1)[-1]
    if last[:2].lower() == "0x":
        return all(c in "0123456789abcdefABCDEF" for c in last[2:])
    return last.isascii() and last.isdigit()


def _ip_of_host(host: str) -> Address | None:
    """The address a host names literally, or None for a DNS name.

    Raises:
        InvalidParameter: a numeric host that is not a canonical dotted-quad or IPv6 literal.
    """
    if ":" in host:
        if "%" in host:
            raise InvalidParameter("a webhook host may not carry an IPv6 zone (%)")
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            raise InvalidParameter("the webhook host is not a valid IPv6 address") from None
    if not _ends_in_number(host):
        return None
    try:
        return ipaddress.IPv4Address(host)  # canonical a.b.c.d, no leading zeros
    except ValueError:
        pass
    legacy = _legacy_ipv4(host)
    if legacy is not None and not is_public_address(legacy):
        raise _private_refusal("the host spells a non-public IPv4 address")
    raise InvalidParameter(
        "the webhook host is a number but not an IPv4 address written as four decimal "
        "numbers (a.b.c.d); write it that way or use a name"
    )


def _is_private_name(host: str) -> bool:
    return any(host == suffix or host.endswith("." + suffix) for suffix in _PRIVATE_SUFFIXES)


def _check_name(host: str) -> None:
    labels = host.split(".")
    if len(host) > 253 or any(
        not 0 < len(label) <= 63 or not set(label) <= _LABEL_CHARS or label[0] == "-"
        for label in labels
    ):
        raise InvalidParameter(
            "the webhook host is not a valid DNS name (letters, digits, '-', dots; write "
            "international names in punycode, xn--)"
        )


def _check_text(url: object) -> str:
    if not isinstance(url, str):
        raise InvalidParameter("a webhook URL is a string")
    if not url:
        raise InvalidParameter("a webhook URL may not be empty")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidParameter(f"a webhook URL is at most {MAX_URL_LENGTH} characters")
    # ASCII only: IDNA and Unicode normalisation would turn fullwidth digits into an
    # address the check never saw. No spaces, controls, backslashes (which browsers and
    # some clients read as '/'), no fragment (never sent, and a classic parser confusion).
    if not url.isascii() or not url.isprintable() or " " in url:
        raise InvalidParameter(
            "a webhook URL is printable ASCII without spaces (percent-encode the path; "
            "write international host names in punycode)"
        )
    if "\\" in url or "#" in url:
        raise InvalidParameter("a webhook URL may not contain '\\' or '#'")
    return url


def _check_host(host: str, *, allow_private: bool) -> Address | None:
    """Check a (lower-case) host: the address it names literally, or None for a name.

    Raises:
        InvalidParameter: no host, a malformed one, a legacy numeric spelling, or (unless
            ``allow_private``) a non-public literal or a ``localhost``-like name.
    """
    host = host.rstrip(".")
    if not host:
        raise InvalidParameter("a webhook URL needs a host")
    address = _ip_of_host(host)
    if address is None:
        _check_name(host)
        if not allow_private and _is_private_name(host):
            raise _private_refusal("the host names this machine or a private network")
    elif not allow_private and not is_public_address(address):
        raise _private_refusal("the host is not a public address")
    return address


def check_webhook_url(url: str, *, allow_private: bool) -> str:
    """Check a webhook URL when it is stored; return its normal form.

    Args:
        url: what the caller gave.
        allow_private: the operator's ``SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS``; when true,
            loopback and private targets are accepted (the URL's shape is still checked).

    Returns:
        ``scheme://host[:port]/path[?query]``, scheme and host lower-cased, a default
        port dropped, an empty path written ``/``, an IPv6 host compressed in brackets.

    Raises:
        InvalidParameter: a URL that is not http(s), has no host, carries a user or
            password, is too long or holds control characters; a numeric host in a legacy
            spelling; a literal address, or a ``localhost``-like name, that is not public
            (unless ``allow_private``). The message never repeats the URL.
    """
    text = _check_text(url)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise InvalidParameter("the webhook URL does not parse (check the host and port)") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise InvalidParameter("a webhook URL starts with http:// or https://")
    if "@" in parts.netloc:
        raise InvalidParameter(
            "a webhook URL may not carry a user or password; the receiver checks the "
            "signature made with the webhook's secret instead"
        )
    address = _check_host(parts.hostname or "", allow_private=allow_private)
    if address is None:
        shown = (parts.hostname or "").rstrip(".")
    else:
        shown = f"[{address.compressed}]" if address.version == 6 else str(address)
    if port == 0:
        raise InvalidParameter("a webhook URL's port is 1-65535")
    netloc = shown if port in (None, _SCHEMES[scheme]) else f"{shown}:{port}"
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme}://{netloc}{parts.path or '/'}{query}"


def resolve_public(host: str, port: int, *, allow_private: bool) -> list[str]:
    """Resolve ``host`` for one delivery; refuse it if any address is not public.

    Args:
        host: a DNS name or an IP literal (an IPv6 one with or without brackets).
        port: the TCP port (passed to the resolver; some answers depend on it).
        allow_private: as in :func:`check_webhook_url`.

    Returns:
        The distinct addresses, in the resolver's order (the sender connects to them in
        turn, never resolving again).

    Raises:
        InvalidParameter: a ``localhost``-like name, or any address that is not public,
            unless ``allow_private``; a host that is no valid name or address.
        ServiceUnavailable: the name does not resolve (now; a later attempt may).
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    bare = bare.rstrip(".").lower()
    literal = _check_host(bare, allow_private=allow_private)
    if literal is not None:
        return [literal.compressed]
    try:
        answers = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise ServiceUnavailable("the webhook host does not resolve") from None
    found: list[str] = []
    for family, *_rest, sockaddr in answers:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if not allow_private and not is_public_address(address):
            # One bad answer condemns the name: which answer a client picks is not ours.
            # The address is not named: the error must not make us an internal DNS oracle.
            raise _private_refusal("the host resolves to a non-public address")
        if address.compressed not in found:
            found.append(address.compressed)
    if not found:
        raise ServiceUnavailable("the webhook host resolves to no IPv4 or IPv6 address")
    return found
