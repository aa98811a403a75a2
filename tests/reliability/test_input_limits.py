"""Unbounded input (issue 21): request size, string lengths, override count, echoed values, config file size."""

from __future__ import annotations

import time

import grpc
import pytest

from controller.api.limits import (
    KEEP_EXPIRED_OVERRIDES,
    MAX_AUDIT_LIMIT,
    MAX_AUTHOR,
    MAX_NAME,
    MAX_REASON,
    MAX_REQUEST_BYTES,
)
from controller.api.store import StateStore
from controller.config import ConfigError, load_settings
from controller.gen.governor.v1 import policy_pb2
from tests.reliability.api_harness import T0, code_of, override, running_api

GRPC_DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024


def test_a_1mb_author_is_refused_by_size_and_nothing_is_stored(tmp_path):
    with running_api(tmp_path) as api:
        before = api.snapshot()
        code, details = code_of(api.stub.SetMode, policy_pb2.SetModeRequest(
            mode=policy_pb2.MODE_PAUSED, author="a" * 1_000_000, reason="r"), metadata=api.metadata, timeout=10)
        # refused by gRPC before any handler parses it: the message limit of the server
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert len(details) < 200
        assert api.snapshot() == before
        assert api.stub.GetStatus(policy_pb2.GetStatusRequest(), metadata=api.metadata, timeout=5).mode \
            == policy_pb2.MODE_ACTIVE  # still serving, mode untouched


@pytest.mark.parametrize("field,request_of,limit", [
    ("author", lambda s: policy_pb2.SetModeRequest(mode=policy_pb2.MODE_SHADOW, author=s), MAX_AUTHOR),
    ("reason", lambda s: policy_pb2.SetModeRequest(mode=policy_pb2.MODE_SHADOW, author="a", reason=s), MAX_REASON),
    ("override.reason", lambda s: override(reason=s), MAX_REASON),
    ("override.author", lambda s: override(author=s), MAX_AUTHOR),
    ("override.pool", lambda s: override(pool=s), MAX_NAME),
    ("id", lambda s: policy_pb2.DeleteOverrideRequest(id=s, author="a"), MAX_NAME),
])
def test_long_strings_are_invalid_argument_naming_the_field_and_not_echoed(tmp_path, field, request_of, limit):
    long = "é" * 20_000  # 40 KB: under the message limit, far over every string bound
    with running_api(tmp_path) as api:
        before = api.snapshot()
        rpc = {policy_pb2.SetModeRequest: api.stub.SetMode, policy_pb2.SetOverrideRequest: api.stub.SetOverride,
               policy_pb2.DeleteOverrideRequest: api.stub.DeleteOverride}
        req = request_of(long)
        code, details = code_of(rpc[type(req)], req, metadata=api.metadata, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details == f"{field}: is too long (20000 characters, at most {limit})"
        assert api.snapshot() == before


def test_an_unknown_long_pool_is_quoted_short(tmp_path):
    with running_api(tmp_path) as api:
        code, details = code_of(api.stub.SetOverride, override(pool="p" * MAX_NAME), metadata=api.metadata,
                                timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("override.pool: unknown pool 'ppp") and "..." in details
        assert len(details) < 200


def test_the_largest_audit_page_fits_the_default_message_limit(tmp_path):
    """MAX_AUDIT_LIMIT entries, every string at its bound in 4-byte UTF-8: one ListAudit answer stays readable
    by a client with gRPC's default 4 MiB limit (six 1 MB reasons used to make the trail unreadable)."""
    wide = "\U0001F600"  # 4 bytes in UTF-8
    store = StateStore(tmp_path / "state.db", max_overrides=MAX_AUDIT_LIMIT + 1)
    pool = "p" * 63  # a config pool name is at most 63 characters
    with store._tx() as c:  # one transaction for speed: the rows are what add_override writes
        for i in range(MAX_AUDIT_LIMIT):
            store._audit(c, T0 + i, wide * MAX_AUTHOR, "override.set",
                         f"ov-{i:06d} min_replicas pool={pool} value=4 ttl=604800s: " + wide * MAX_REASON,
                         "cert:" + wide * MAX_AUTHOR)
    store.close()
    with running_api(tmp_path) as api:
        resp = api.stub.ListAudit(policy_pb2.ListAuditRequest(limit=MAX_AUDIT_LIMIT), metadata=api.metadata,
                                  timeout=10)
        assert len(resp.entries) == MAX_AUDIT_LIMIT
        assert resp.ByteSize() < GRPC_DEFAULT_MAX_MESSAGE
        code, details = code_of(api.stub.ListAudit, policy_pb2.ListAuditRequest(limit=MAX_AUDIT_LIMIT + 1),
                                metadata=api.metadata, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("limit: must be in 1..500")


def test_the_largest_valid_override_fits_the_request_limit(tmp_path):
    wide = "\U0001F600"
    req = override(kind=policy_pb2.OVERRIDE_KIND_PROFILE, pool="", text=wide * MAX_NAME, author=wide * MAX_AUTHOR,
                   reason=wide * MAX_REASON)
    assert req.ByteSize() < MAX_REQUEST_BYTES / 4


def test_active_overrides_are_capped_and_the_cap_frees_as_they_expire(tmp_path):
    with running_api(tmp_path, max_overrides=5) as api:
        for i in range(5):
            api.stub.SetOverride(override(ttl_s=60.0 + i), metadata=api.metadata, timeout=5)
        before = api.snapshot()
        code, details = code_of(api.stub.SetOverride, override(), metadata=api.metadata, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("override: 5 overrides are already active (at most 5, api.max_overrides)")
        assert api.snapshot() == before
        api.clock.advance(60.5)  # the first one has expired
        api.stub.SetOverride(override(), metadata=api.metadata, timeout=5)
        assert len(api.store.list_overrides(api.clock.now_s())) == 5


def test_expired_overrides_kept_for_list_all_are_bounded(tmp_path):
    store = StateStore(tmp_path / "state.db")
    n = KEEP_EXPIRED_OVERRIDES + 30
    for i in range(n):
        store.add_override("freeze", ttl_s=1.0, author="a", now_s=T0 + i, pool="pool-a")
        store.expire_overrides(T0 + i + 1.0)
    kept = store.list_overrides(T0 + n + 1.0, include_expired=True)
    assert len(kept) == KEEP_EXPIRED_OVERRIDES
    assert kept[-1].override_id == f"ov-{n:06d}"  # the newest are the ones kept
    assert sum(e.action == "override.expired" for e in store.list_audit(10**6)) == n  # every expiry audited
    store.close()


def test_a_50mb_config_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: as large as the 50 MB file that was parsed for 30 s
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_settings(big)
    assert time.monotonic() - start < 1.0
    assert "the config file is 52428800 bytes; at most 1048576 are read" in str(info.value)
