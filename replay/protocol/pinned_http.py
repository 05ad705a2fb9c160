"""Connections only to addresses checked here: the host is resolved once, every address it resolves to must be
globally routable (no loopback, private, link-local / cloud metadata, multicast, reserved, shared or
unspecified address, also not inside IPv4-mapped, 6to4, Teredo or NAT64 IPv6), and the socket connects to that
checked address itself, so a DNS answer cannot change between check and connect. Hosts in ``allowed`` (tests,
on-premises stores) skip the address check. Standard library only."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import urllib.parse

from replay.protocol.fetch_limits import FetchBudget, FetchRefused

NAT64 = ipaddress.ip_network("64:ff9b::/96")


def open_connection(parts: urllib.parse.SplitResult, name: str, budget: FetchBudget, allowed: frozenset[str]):
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = checked_address(host, port, name, allowed)
    timeout = min(budget.left(), 30.0)
    if parts.scheme == "https":
        return PinnedHTTPSConnection(host, port, address, timeout)
    return PinnedHTTPConnection(host, port, address, timeout)


def checked_address(host: str, port: int, name: str, allowed: frozenset[str]) -> str:
    """The first address ``host`` resolves to, once every address it resolves to passed the check."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise FetchRefused(f"{name}: the host {host} does not resolve", transient=True) from None
    addresses = [info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise FetchRefused(f"{name}: the host {host} has no IPv4 or IPv6 address")
    if host not in allowed:
        for address in addresses:
            why = forbidden(address)
            if why:
                raise FetchRefused(f"{name}: the host {host} resolves to a {why} address, which is never fetched")
    return addresses[0]


def forbidden(address: str) -> str | None:
    """Why an address must not be connected to (e.g. "loopback"), or None for a globally routable one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    embedded = []
    if ip.version == 6:
        embedded = [ip.ipv4_mapped, ip.sixtofour, ip.teredo and ip.teredo[1]]
        if ip in NAT64:
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    for candidate in [*(e for e in embedded if e is not None), ip]:
        for kind in ("loopback", "link_local", "private", "multicast", "reserved", "unspecified"):
            if getattr(candidate, f"is_{kind}"):
                return kind.replace("_", "-")
        if not candidate.is_global:
            return "non-global"
    return None


class PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to an address checked beforehand; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class PinnedHTTPSConnection(PinnedHTTPConnection):
    """HTTPS to a checked address, the certificate verified against the host name."""

    default_port = 443

    def connect(self) -> None:
        super().connect()
        self.sock = ssl.create_default_context().wrap_socket(self.sock, server_hostname=self.host)
