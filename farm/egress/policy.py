"""Allowlists: host patterns with ports, a ceiling they must fit, and the addresses refused.

A rule is ``host``, ``*.domain`` (any name under it, not itself) or ``*`` (any host), with
``:port``, ``:port,port`` or ``:*`` (any port; 80 and 443 when none is named). A box's rules
must each fit a rule of the operator's ceiling (``box_policy``), else the request is refused.
Addresses are checked after resolving: only global unicast ones, plus ranges the operator
names.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_PORTS = frozenset({80, 443})
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class PolicyError(ValueError):
    """A rule that cannot be read, or an ask over the ceiling."""


@dataclass(frozen=True)
class Rule:
    host: str  # "example.com", "*.example.com" or "*"
    ports: frozenset[int] | None  # None: any port

    @classmethod
    def parse(cls, text: str) -> Rule:
        spec = text.strip().lower().rstrip(".")
        host, ports = spec, DEFAULT_PORTS  # type: str, frozenset[int] | None
        if spec.count(":") == 1 or (spec.startswith("[") and "]:" in spec):
            host, _, port_text = spec.rpartition(":")
            ports = None if port_text == "*" else _ports(text, port_text)
        host = host.strip("[]")
        name = host[2:] if host.startswith("*.") else host
        if host != "*" and (not name or "*" in name or "/" in name or " " in name):
            raise PolicyError(
                f"egress rule {text!r}: a host, '*.domain' or '*', with ':port' if not 80/443"
            )
        return cls(host, ports)

    def matches(self, host: str, port: int) -> bool:
        return (self.ports is None or port in self.ports) and _host_in(host, self.host)

    def fits(self, ceiling: Rule) -> bool:
        """Everything this rule allows, ``ceiling`` allows too."""
        ports_fit = ceiling.ports is None or (
            self.ports is not None and self.ports <= ceiling.ports
        )
        return ports_fit and _host_in(self.host, ceiling.host)

    def __str__(self) -> str:
        if self.ports is None:
            return f"{self.host}:*"
        ports = "" if self.ports == DEFAULT_PORTS else ":" + ",".join(map(str, sorted(self.ports)))
        return f"{self.host}{ports}"


def _ports(text: str, port_text: str) -> frozenset[int]:
    try:
        ports = frozenset(int(p) for p in port_text.split(","))
    except ValueError:
        raise PolicyError(f"egress rule {text!r}: ports must be numbers or '*'") from None
    if not ports or not all(0 < p < 65536 for p in ports):
        raise PolicyError(f"egress rule {text!r}: ports must be 1-65535")
    return ports


def _host_in(host: str, pattern: str) -> bool:
    """Whether ``host`` (a name or a pattern) falls under ``pattern``."""
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        domain = pattern[1:]  # ".example.com"
        return host.endswith(domain) and host != "*"
    return host == pattern


def parse_rules(texts: Iterable[str]) -> tuple[Rule, ...]:
    return tuple(dict.fromkeys(Rule.parse(t) for t in texts if t.strip()))


@dataclass(frozen=True)
class Policy:
    """One box's allowlist (rules), within the farm's ceiling, and the private ranges the
    operator opened (``private``)."""

    rules: tuple[Rule, ...]
    private: tuple[Network, ...] = ()

    def allows(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        return any(rule.matches(host, port) for rule in self.rules)

    def address_refused(self, address: str) -> str | None:
        """Why a resolved address is off limits, or ``None``: anything not global unicast
        (loopback, private, link-local with the clouds' metadata, multicast, reserved, ...)
        unless the operator named its range."""
        ip: Address = ipaddress.ip_address(address.split("%")[0])
        inner = _embedded(ip)  # an IPv4 address inside (mapped, NAT64, 6to4, compatible)
        if inner is not None:
            why = self.address_refused(str(inner))
            return None if why is None else f"{ip} carries {inner}: {why}"
        if any(ip in net for net in self.private):
            return None
        if ip.is_global and not ip.is_multicast:
            return None
        return f"{ip} is a non-public address (FARM_EGRESS_ALLOW_PRIVATE opens ranges)"

    def describe(self) -> str:
        return ", ".join(map(str, self.rules)) or "nothing"


# IPv6 prefixes that carry an IPv4 address in their last 32 bits (a translator on the way
# turns them into it): the well-known and the local-use NAT64 prefix.
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible (:: and ::1 aside)


def _embedded(ip: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for, if any (checked instead of the wrapper)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None or ip.sixtofour is not None:
        return ip.ipv4_mapped or ip.sixtofour
    if any(ip in net for net in _NAT64) or (ip in _COMPATIBLE and int(ip) > 1):
        return low
    return None


def box_policy(asked: Sequence[str], ceiling: Sequence[str], private: Sequence[str]) -> Policy:
    """The policy of a box that asked for ``asked``: refused (``PolicyError``) when a rule
    goes beyond every rule of the operator's ``ceiling``."""
    rules, limits = parse_rules(asked), parse_rules(ceiling)
    for rule in rules:
        if not any(rule.fits(limit) for limit in limits):
            allowed = ", ".join(map(str, limits)) or "nothing (FARM_EGRESS_ALLOW is empty)"
            raise PolicyError(f"egress to {rule} is beyond this farm's ceiling: {allowed}")
    return Policy(rules, parse_networks(private))


def parse_networks(texts: Iterable[str]) -> tuple[Network, ...]:
    try:
        return tuple(ipaddress.ip_network(t.strip(), strict=False) for t in texts if t.strip())
    except ValueError as exc:
        raise PolicyError(f"not an address range: {exc}") from None
