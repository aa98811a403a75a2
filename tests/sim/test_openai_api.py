"""A live simulated replica speaks the engines' HTTP API: completions (JSON and SSE), health, models."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from controller.paths import PROJECT_ROOT
from controller.sim.live import LiveFleet
from controller.sim.openai_api import ApiError, block_ids, parse_request, pseudo_tokens

SCENARIO = PROJECT_ROOT / "scenarios" / "dataplane" / "fleet.yaml"
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def test_prompt_tokens_are_estimated_at_four_characters_and_blocks_chain():
    assert pseudo_tokens("hello world, abcdefghi") == ["hell", "o", "worl", "d,", "abcd", "efgh", "i"]
    a = block_ids(pseudo_tokens("x" * 64 + " tail one"), 8)
    b = block_ids(pseudo_tokens("x" * 64 + " other tail"), 8)
    assert len(a) == 2 and a == b  # the shared 64 characters: two 8-token blocks
    assert block_ids(pseudo_tokens("y" * 64), 8) != a


def test_parse_request_reads_the_fields_and_names_bad_ones():
    r = parse_request(json.dumps({"prompt": "a b c", "max_tokens": 7, "stream": True}).encode(), chat=False,
                      served_model=MODEL, block_tokens=16, priority_class="Critical")
    assert (r.prompt_tokens, r.max_tokens, r.stream, r.prio) == (3, 7, True, 0)
    r = parse_request(json.dumps({"messages": [{"role": "user", "content": "hi"}], "prompt_tokens": 900}).encode(),
                      chat=True, served_model=MODEL, block_tokens=16, priority_class=None)
    assert (r.prompt_tokens, r.max_tokens, r.prio) == (900, 16, 1)
    for body, chat, msg in [(b"{", False, "not valid JSON"), (b'{"prompt": 3}', False, "prompt: must be a string"),
                            (b'{"prompt": "x", "max_tokens": 0}', False, "max_tokens: 0"),
                            (b'{"messages": []}', True, "messages: must be a non-empty list"),
                            (b'{"prompt": "x", "model": "gpt-9"}', False, "'gpt-9' does not exist")]:
        with pytest.raises(ApiError, match=msg):
            parse_request(body, chat=chat, served_model=MODEL, block_tokens=16, priority_class=None)
    with pytest.raises(ApiError, match="unknown priority class 'gold'"):
        parse_request(b'{"prompt": "x"}', chat=False, served_model=MODEL, block_tokens=16, priority_class="gold")


@pytest.fixture(scope="module")
def live():
    lf = LiveFleet(SCENARIO, step_wall_s=0.01)
    info = lf.start()
    yield lf, info["replicas"][0]
    lf.stop()


def _post(url: str, body: object, headers: dict | None = None):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                 **(headers or {})})
    return urllib.request.urlopen(req, timeout=20)


@pytest.mark.e2e
def test_health_models_and_a_json_completion(live):
    lf, rep = live
    with urllib.request.urlopen(rep["api"] + "/health", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(rep["api"] + "/v1/models", timeout=5) as r:
        models = json.loads(r.read())
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 8192
    before = lf.served().get(rep["id"], 0)
    with _post(rep["api"] + "/v1/completions", {"prompt": "word " * 40, "max_tokens": 5}) as r:
        assert r.headers["x-governor-replica"] == rep["id"]
        out = json.loads(r.read())
    assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}
    assert lf.served()[rep["id"]] == before + 1


@pytest.mark.e2e
def test_chat_stream_sends_one_chunk_per_token_then_done_in_engine_time(live):
    lf, rep = live
    t0 = time.monotonic()
    stamps, events = [], []
    with _post(rep["api"] + "/v1/chat/completions",
               {"messages": [{"role": "user", "content": "tell me " * 100}], "max_tokens": 40, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        for line in r:
            if line.startswith(b"data: "):
                stamps.append(time.monotonic() - t0)
                events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(tokens) == 40 and tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 202, "completion_tokens": 40, "total_tokens": 242}
    # 40 decode steps of an 8B model on an A100 take a few hundred ms of engine time, streamed as it runs
    assert 0.1 < stamps[-1] - stamps[0] < 5.0


@pytest.mark.e2e
def test_bad_requests_get_openai_style_errors(live):
    _, rep = live
    for path, body, code, text in [("/v1/completions", {"prompt": 1}, 400, "prompt: must be a string"),
                                   ("/v1/completions", {"prompt": "x", "max_tokens": 9000}, 400, "context length"),
                                   ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
                                   ("/v1/completions", {"prompt": "x", "model": "nope"}, 404, "does not exist")]:
        with pytest.raises(urllib.error.HTTPError) as exc:
            _post(rep["api"] + path, body)
        assert exc.value.code == code
        assert text in json.loads(exc.value.read())["error"]["message"]


@pytest.mark.e2e
def test_a_draining_replica_finishes_its_stream_refuses_new_requests_and_leaves_discovery():
    lf = LiveFleet(SCENARIO, step_wall_s=0.01)
    info = lf.start()
    try:
        a100 = [r for r in info["replicas"] if r["pool"] == "llama8b-a100"]
        streams = {r["id"]: _post(r["api"] + "/v1/completions", {"prompt": "x " * 10, "max_tokens": 100,
                                                                 "stream": True}) for r in a100}
        for resp in streams.values():
            assert resp.readline().startswith(b"data: ")  # streaming: the engines have the requests
        fleet = lf.fleet
        assert fleet is not None
        with lf.lock:
            fleet.set_pool_target("llama8b-a100", replicas=1, warm_standby=0)

        def sd_labels() -> dict:
            return {t["labels"]["replica"]: t["labels"] for t in lf.targets() if t["labels"].get("kind") == "vllm"}

        marked = [r for r in a100 if sd_labels()[r["id"]].get("draining") == "true"]
        assert len(marked) == 1  # one of the two drains; the other stays unmarked
        victim = marked[0]
        resp = streams[victim["id"]]
        with pytest.raises(urllib.error.HTTPError) as exc:
            _post(victim["api"] + "/v1/completions", {"prompt": "late", "max_tokens": 1})
        assert exc.value.code == 503
        for r in streams.values():
            assert r.read().splitlines()[-2:] == [b"data: [DONE]", b""]  # both streams ran to the end
        deadline = time.monotonic() + 10
        while victim["id"] in sd_labels():
            assert time.monotonic() < deadline, "the drained replica stayed in discovery"
            time.sleep(0.01)  # polling the live fleet under a deadline
    finally:
        lf.stop()
