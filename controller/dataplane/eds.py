"""The picker's replicas as Envoy's endpoint discovery (EDS, state of the world over gRPC, on the ext_proc port).

Envoy's `override_host` load-balancing policy (deploy/envoy/loopback.yaml) sends a request to the hosts the picker
names — the primary, then on a retry the fallback — but only to hosts its cluster already has. The picker is the
one component that tracks the fleet (static endpoints, DNS, HTTP SD, InferencePools), so it tells Envoy: every
replica of every pool it routes, as one ClusterLoadAssignment for each cluster name Envoy asks for. A new version
goes out when the set of addresses changes (not when a replica's health or load does: the picker decides who is
named, Envoy only needs to know the addresses). Envoy's ACK or NACK of each version comes back on the stream;
a NACK is logged with Envoy's reason.

A request for another resource type, more than MAX_NAMES cluster names or a name longer than MAX_NAME_CHARS is
refused INVALID_ARGUMENT naming the field (each answer carries the whole fleet per name).

Only IP-literal `host:port` addresses, written as Envoy writes them (`10.0.0.1:8000`, `[fd00::1]:8000`), can be
hosts the picker names (EDS does not resolve names); any other is left out and logged once (the picker's DNS
pools resolve to IPs; the ORIGINAL_DST cluster used before took IPs only too).

Must not: decide anything (membership comes from the picker's sources), or hold the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Iterable

import grpc
from envoy.config.core.v3 import address_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from google.protobuf import any_pb2

log = logging.getLogger(__name__)

CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
# A request names the clusters it wants (Envoy: the one EDS cluster of its bootstrap); each answer carries the whole
# fleet per name, so the names are bounded: a caller cannot turn one small request into a large answer.
MAX_NAMES = 16
MAX_NAME_CHARS = 253


def split_address(address: str) -> tuple[str, int] | None:
    """(IP, port) of an `ip:port` or `[ipv6]:port` address, or None if it is not an IP literal in its canonical
    form with a port: Envoy names its hosts canonically (`[fd00::1]:8000`), and override_host finds a host the
    picker names only by that exact string."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.compressed != host or bracketed != (ip.version == 6):
        return None
    return host, int(port)


def load_assignment(cluster: str, addresses: Iterable[str]) -> endpoint_pb2.ClusterLoadAssignment:
    """One locality holding every address (IP literals only), all HEALTHY: the picker's own readings decide which
    of them are named, and Envoy's override_host policy does not consult host health."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster)
    group = cla.endpoints.add()
    for a in addresses:
        hp = split_address(a)
        if hp is None:
            continue
        group.lb_endpoints.add(
            endpoint=endpoint_components_pb2.Endpoint(address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(address=hp[0], port_value=hp[1]))),
            health_status=health_check_pb2.HEALTHY)
    return cla


def request_problem(req: discovery_pb2.DiscoveryRequest) -> str:
    """What is wrong with a DiscoveryRequest for this server, naming the field, or ""."""
    if req.type_url and req.type_url != CLA_TYPE:
        return f"type_url: {req.type_url[:100]!r} is not {CLA_TYPE} (this server answers EDS only)"
    if len(req.resource_names) > MAX_NAMES:
        return f"resource_names: {len(req.resource_names)} names (at most {MAX_NAMES})"
    for i, name in enumerate(req.resource_names):
        if not name or len(name) > MAX_NAME_CHARS:
            return f"resource_names[{i}]: a cluster name of 1 to {MAX_NAME_CHARS} characters ({len(name)} given)"
    return ""


class EndpointDiscovery(eds_pb2_grpc.EndpointDiscoveryServiceServicer):
    """The current address set and its version; each EDS stream gets every new version (on the picker's loop)."""

    def __init__(self) -> None:
        self.addresses: tuple[str, ...] = ()
        self.version = 0
        self.nacks = 0
        self._changed = asyncio.Event()
        self._skipped: set[str] = set()

    def publish(self, addresses: Iterable[str]) -> bool:
        """The picker's replicas now; True if that changed the set (a new version is pushed to every stream)."""
        usable = []
        for a in dict.fromkeys(addresses):
            if split_address(a) is None:
                if a not in self._skipped:
                    self._skipped.add(a)
                    log.warning("endpoint %r is not an ip:port address in canonical form (10.0.0.1:8000, "
                                "[fd00::1]:8000): Envoy cannot route to it", a)
                continue
            usable.append(a)
        new = tuple(sorted(usable))
        if new == self.addresses and self.version:
            return False
        self.addresses = new
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    def _response(self, names: list[str], nonce: int) -> discovery_pb2.DiscoveryResponse:
        resources = []
        for name in names:
            res = any_pb2.Any()
            res.Pack(load_assignment(name, self.addresses))
            resources.append(res)
        return discovery_pb2.DiscoveryResponse(version_info=str(self.version), resources=resources,
                                               type_url=CLA_TYPE, nonce=str(nonce))

    async def StreamEndpoints(self, request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],  # noqa: N802
                              context: grpc.aio.ServicerContext) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for r in request_iterator:
                    await requests.put(r)
            finally:
                await requests.put(None)

        reader = asyncio.create_task(read())
        names: list[str] = []
        sent = -1  # the version last sent on this stream
        nonce = 0
        try:
            while True:
                if names and sent != self.version:
                    nonce += 1
                    sent = self.version
                    yield self._response(names, nonce)
                    continue
                changed = self._changed
                get = asyncio.ensure_future(requests.get())
                wake = asyncio.ensure_future(changed.wait())
                await asyncio.wait({get, wake}, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                if not get.done():
                    get.cancel()
                    continue  # a new version: sent at the top of the loop
                req = get.result()
                if req is None:
                    return
                problem = request_problem(req)
                if problem:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                if req.error_detail.code:
                    self.nacks += 1
                    log.warning("Envoy refused endpoint version %s: %s", req.version_info or "(none)",
                                req.error_detail.message)
                if list(req.resource_names) != names:
                    names = list(req.resource_names)
                    sent = -1  # a new subscription: answer it with the current version
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
