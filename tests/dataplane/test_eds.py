"""The picker's EDS (controller/dataplane/eds.py) over real gRPC: the first answer, a new version on a membership
change and only then, Envoy's NACK counted, addresses Envoy cannot take left out, requests it cannot serve refused
naming the field."""

from __future__ import annotations

import asyncio

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from google.rpc import status_pb2  # type: ignore[import-untyped]

from controller.dataplane.eds import (
    CLA_TYPE,
    MAX_NAMES,
    EndpointDiscovery,
    load_assignment,
    request_problem,
    split_address,
)


def test_addresses_envoy_can_take():
    assert split_address("10.0.0.1:8000") == ("10.0.0.1", 8000)
    assert split_address("[fd00::1]:8000") == ("fd00::1", 8000)
    for bad in ("vllm-0.vllm:8000", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:http", ":8000", "[fd00:0::1]:8000",
                "fd00::1:8000", "[10.0.0.1]:8000"):
        assert split_address(bad) is None, bad
    cla = load_assignment("inference_pool", ["10.0.0.1:8000", "vllm-0:8000", "[fd00::1]:9000"])
    got = [(e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
           for e in cla.endpoints[0].lb_endpoints]
    assert cla.cluster_name == "inference_pool" and got == [("10.0.0.1", 8000), ("fd00::1", 9000)]


def _hosts(resp: discovery_pb2.DiscoveryResponse) -> list[str]:
    cla = endpoint_pb2.ClusterLoadAssignment()
    assert resp.type_url == CLA_TYPE and len(resp.resources) == 1 and resp.resources[0].Unpack(cla)
    return [f"{e.endpoint.address.socket_address.address}:{e.endpoint.address.socket_address.port_value}"
            for e in cla.endpoints[0].lb_endpoints]


def test_a_stream_gets_the_current_set_then_each_change_once():
    asyncio.run(_stream())


async def _stream() -> None:
    eds = EndpointDiscovery()
    assert eds.publish(["10.0.0.1:8000", "10.0.0.2:8000"]) and not eds.publish(["10.0.0.2:8000", "10.0.0.1:8000"])
    server = grpc.aio.server()
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(eds, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            requests: asyncio.Queue = asyncio.Queue()

            async def gen():
                while (r := await requests.get()) is not None:
                    yield r

            call = eds_pb2_grpc.EndpointDiscoveryServiceStub(ch).StreamEndpoints(gen())
            await requests.put(discovery_pb2.DiscoveryRequest(type_url=CLA_TYPE, resource_names=["inference_pool"]))
            first = await asyncio.wait_for(call.read(), 5)
            assert _hosts(first) == ["10.0.0.1:8000", "10.0.0.2:8000"] and first.version_info == "1"
            await requests.put(discovery_pb2.DiscoveryRequest(type_url=CLA_TYPE, resource_names=["inference_pool"],
                                                              version_info="1", response_nonce=first.nonce))  # ACK
            eds.publish(["10.0.0.1:8000", "10.0.0.3:8000", "not-an-ip:80"])
            second = await asyncio.wait_for(call.read(), 5)
            assert _hosts(second) == ["10.0.0.1:8000", "10.0.0.3:8000"] and second.version_info == "2"
            assert second.nonce != first.nonce
            await requests.put(discovery_pb2.DiscoveryRequest(
                type_url=CLA_TYPE, resource_names=["inference_pool"], version_info="1", response_nonce=second.nonce,
                error_detail=status_pb2.Status(code=3, message="bad endpoint")))  # NACK: Envoy keeps version 1
            deadline = asyncio.get_running_loop().time() + 5
            while eds.nacks == 0:  # counted, and nothing re-sent for it (the next version answers it)
                assert asyncio.get_running_loop().time() < deadline, "the NACK was not read"
                await asyncio.sleep(0.01)  # polling a condition under a deadline
            eds.publish(["10.0.0.4:8000"])
            third = await asyncio.wait_for(call.read(), 5)
            assert _hosts(third) == ["10.0.0.4:8000"] and third.version_info == "3" and eds.nacks == 1
            await requests.put(None)
            call.cancel()
    finally:
        await server.stop(0.5)


def test_a_request_it_cannot_serve_is_refused_naming_the_field():
    ok = discovery_pb2.DiscoveryRequest(type_url=CLA_TYPE, resource_names=["inference_pool"])
    assert request_problem(ok) == ""
    cases = {
        "type_url": discovery_pb2.DiscoveryRequest(type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster"),
        "resource_names:": discovery_pb2.DiscoveryRequest(resource_names=[f"c{i}" for i in range(MAX_NAMES + 1)]),
        "resource_names[1]": discovery_pb2.DiscoveryRequest(resource_names=["ok", "x" * 300]),
    }
    for field, req in cases.items():
        assert request_problem(req).startswith(field), (field, request_problem(req))
    asyncio.run(_refused(cases["resource_names:"]))


async def _refused(req: discovery_pb2.DiscoveryRequest) -> None:
    server = grpc.aio.server()
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(EndpointDiscovery(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            async def one():
                yield req

            call = eds_pb2_grpc.EndpointDiscoveryServiceStub(ch).StreamEndpoints(one())
            try:
                await asyncio.wait_for(call.read(), 5)
                raise AssertionError("answered a request it should refuse")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "resource_names" in (exc.details() or "")
    finally:
        await server.stop(0.5)
