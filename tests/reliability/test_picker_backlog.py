"""The picker under a backlog: requests that arrive while its event loop is busy wait for it, they are not cancelled.

Found by `governor bench api-load` (docs/RELIABILITY.md, "Load"): with the daemon, the picker, Envoy and the load
generators on two cores, 4-39 % of the requests through Envoy answered 500 (six runs). Envoy's ext_proc filter logged
"gRPC stream closed remotely with status 1: CANCELLED" ~40 ms after opening the stream, before the picker had
seen it: gRPC's server core keeps the streams the application has not yet asked for in a queue of bounded length
(`grpc.server.max_pending_requests`, `..._hard_limit`) and cancels what overflows it. With ~1,500 requests in
flight and a starved event loop, the queue overflowed. The picker now lets the queue hold as many streams as it
accepts at once (`EXTPROC_MAX_STREAMS`), so a backlog turns into latency, bounded by Envoy's message timeout, and
the picker's own admission (queue budget, hold timeout) stays the one that rejects.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from controller.dataplane.policy_store import PoolSettings, Settings
from controller.dataplane.server import PickerConfig, PickerThread
from tests.fakes.idle_engines import idle_engines

# More streams than gRPC's default bounds on not-yet-requested calls let wait: with the defaults 1,073 of these
# 3,500 failed (INTERNAL) here. A few seconds of one core.
STREAMS = 3_500
DEADLINE_S = 60.0  # the whole backlog, once released, on a loaded 2-core machine


@pytest.fixture()
def picker() -> Iterator[PickerThread]:
    with idle_engines(2) as addr, PickerThread(PickerConfig(
            groups={"chat": ["a"]}, endpoints={"a": addr}, defaults=Settings({"a": PoolSettings()}),
            scrape_interval_s=3600.0)) as t:
        yield t


async def _one(stub: ep_grpc.ExternalProcessorStub, sent: asyncio.Queue) -> tuple[str, str]:
    """A GET's headers (end of stream): the picker decides on it. Returns (status, answer kind)."""
    call = stub.Process()
    try:
        try:
            await call.write(ep_pb.ProcessingRequest(request_headers=ep_pb.HttpHeaders(end_of_stream=True)))
        finally:
            sent.put_nowait(None)  # written, or refused at once: either way the backlog is in place
        resp = await call.read()
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:  # the picker ends the stream once Envoy would: no more asked
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, ""
    return (await call.code()).name, resp.WhichOneof("response") if resp is not grpc.aio.EOF else "eof"


async def _backlog(address: str, release: threading.Event) -> list[tuple[str, str]]:
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_concurrent_streams", STREAMS * 2)]) as ch:
        stub = ep_grpc.ExternalProcessorStub(ch)
        sent: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.ensure_future(_one(stub, sent)) for _ in range(STREAMS)]
        for _ in range(STREAMS):
            await asyncio.wait_for(sent.get(), DEADLINE_S)  # every stream is open and its request written
        release.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)


def test_streams_arriving_while_the_loop_is_blocked_are_all_answered(picker):
    blocked, release = threading.Event(), threading.Event()

    def block() -> None:  # runs on the picker's loop: nothing there runs until `release` is set
        blocked.set()
        release.wait(DEADLINE_S)

    picker.loop.call_soon_threadsafe(block)
    assert blocked.wait(DEADLINE_S)
    try:
        results = asyncio.run(_backlog(picker.running.extproc_address, release))
    finally:
        release.set()
    statuses = {s for s, _ in results}
    assert statuses == {"OK"}, {s: sum(1 for r, _ in results if r == s) for s in statuses}
    # every request got the picker's decision: a route (headers answer), never a cancellation or an empty stream
    assert {kind for _, kind in results} == {"request_headers"}
