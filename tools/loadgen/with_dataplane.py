"""Run a load generator against the loopback data plane, and say what Governor's side counted.

Starts what `governor bench dataplane` starts (controller/bench/dataplane.py), each in its own
process: `governor sim scenarios/dataplane/fleet.yaml` (two pools of two simulated Llama-3-8B
replicas serving the OpenAI API), `governor picker` with static membership and its default policy
(equal pool weights, no cap, no admission limits), and Envoy from deploy/envoy/loopback.yaml.
Then it runs the command after `--` with `{url}` replaced by Envoy's listener URL and `{model}` by
the served model's name, and scrapes, before and after it, the replicas' vLLM-style counters and
histograms, the picker's metrics and Envoy's downstream counters. It prints one JSON object with
the differences: requests served per replica and pool, prompt and generation tokens as the
replicas count them, the engines' TTFT / inter-token latency quantiles, the picker's arrivals,
rejections, holds and pick latency, Envoy's responses by status class.

For a third-party load generator (aiperf, inference-perf) with a tokenizer built locally; see
tools/loadgen/README.md (the figures: docs/BENCHMARKS.md, "Data plane"). Run it with the project's
Python from the repository root:

    PYTHONPATH=$PWD .venv/bin/python tools/loadgen/with_dataplane.py --out run.json -- \
        /tmp/lg-venv/bin/aiperf profile --url {url} --model {model} ...

Must not: listen anywhere but 127.0.0.1, outlive the command (every part it starts, it stops),
or be imported by the project or its tests (a tool, not a module; not part of `make test`).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from controller.bench.dataplane import SCENARIO, _buckets, _metric_sum, _scrape, histogram_quantile
from controller.dataplane.child import GovernorChild
from controller.dataplane.envoy import EnvoyProcess

REPLICA_COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
REPLICA_HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")
PICKER_COUNTERS = ("governor_picker_arrivals_total", "governor_picker_held_total", "governor_picker_rejected_total")


def _hist_sum(texts: list[str], name: str) -> list[tuple[float, float]]:
    """One histogram summed over several scrapes (replicas) bucket by bucket."""
    total: dict[float, float] = {}
    for text in texts:
        for le, c in _buckets(text, name):
            total[le] = total.get(le, 0.0) + c
    return sorted(total.items())


def _envoy_stats(admin_url: str) -> dict[str, float]:
    with urllib.request.urlopen(admin_url + "/stats?format=json&filter=^http\\.inference\\.", timeout=5) as r:
        stats = json.load(r).get("stats", [])
    return {s["name"]: float(s["value"]) for s in stats if "value" in s}


def _snapshot(replicas: list[dict], picker_metrics: str, envoy_admin: str) -> dict:
    texts = {r["id"]: _scrape(r["metrics"]) for r in replicas}
    picker = _scrape(picker_metrics)
    return {"replicas": {rid: {c: _metric_sum(t, c) for c in REPLICA_COUNTERS} for rid, t in texts.items()},
            "hist": {h: _hist_sum(list(texts.values()), h) for h in REPLICA_HISTOGRAMS},
            "picker": {c: _metric_sum(picker, c) for c in PICKER_COUNTERS},
            "pick": _buckets(picker, "governor_picker_pick_latency_seconds"),
            "envoy": _envoy_stats(envoy_admin)}


def _ms(x: float) -> float | None:
    return None if math.isnan(x) else round(x * 1000, 3)


def summarise(before: dict, after: dict, replicas: list[dict], wall_s: float, rc: int) -> dict:
    per_rep = {rid: {c.removeprefix("vllm:").removesuffix("_total"): after["replicas"][rid][c] - v
                     for c, v in counters.items()} for rid, counters in before["replicas"].items()}
    pools: dict[str, float] = {}
    for r in replicas:
        pools[r["pool"]] = pools.get(r["pool"], 0.0) + per_rep[r["id"]]["request_success"]
    engine = {}
    for h in REPLICA_HISTOGRAMS:
        short = h.removeprefix("vllm:").removesuffix("_seconds")
        for q in (0.5, 0.99):
            engine[f"{short}_p{round(q * 100)}_ms"] = _ms(histogram_quantile(q, before["hist"][h], after["hist"][h]))
    envoy = {k.removeprefix("http.inference."): after["envoy"].get(k, 0.0) - v for k, v in before["envoy"].items()
             if k.split(".")[-1] in ("downstream_rq_total", "downstream_rq_2xx", "downstream_rq_4xx",
                                     "downstream_rq_5xx")}
    return {"command_rc": rc, "wall_s": round(wall_s, 1),
            "served_total": sum(p["request_success"] for p in per_rep.values()),
            "served_per_pool": pools, "per_replica": per_rep,
            "prompt_tokens_total": sum(p["prompt_tokens"] for p in per_rep.values()),
            "generation_tokens_total": sum(p["generation_tokens"] for p in per_rep.values()),
            "engine_histograms": engine,
            "picker": {c.removeprefix("governor_picker_"): after["picker"][c] - v
                       for c, v in before["picker"].items()},
            "pick_latency_p50_ms": _ms(histogram_quantile(0.5, before["pick"], after["pick"])),
            "pick_latency_p99_ms": _ms(histogram_quantile(0.99, before["pick"], after["pick"])),
            "envoy": envoy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-wall", type=float, default=0.01,
                    help="the simulator's wall seconds per clock step, (0, 0.1] (default 0.01)")
    ap.add_argument("--timeout", type=float, default=900.0, help="kill the command after SECONDS (default 900)")
    ap.add_argument("--out", type=Path, help="also write the JSON summary to this file")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... ({url}, {model} are replaced)")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        print("with_dataplane: no command: give it after `--`, e.g. -- aiperf profile --url {url} ...",
              file=sys.stderr)
        return 2
    if not (0 < args.step_wall <= 0.1 and args.timeout > 0):
        print("with_dataplane: --step-wall must be in (0, 0.1], --timeout > 0", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        sim = GovernorChild(["sim", str(SCENARIO), "--step-wall", f"{args.step_wall:g}"])
        stack.callback(sim.stop)
        replicas = sim.info["replicas"]
        pools: dict[str, list[str]] = {}
        for r in replicas:
            pools.setdefault(r["pool"], []).append(r["address"])
        picker = GovernorChild(["picker", *[a for p in sorted(pools) for a in ("--pool", p + "=" + ",".join(pools[p]))],
                                "--extproc-port", "0", "--control-port", "0", "--metrics-port", "0",
                                "--scrape-interval", "0.5"])
        stack.callback(picker.stop)
        host, port = picker.info["extproc"].rsplit(":", 1)
        envoy = EnvoyProcess(picker_address=host, picker_port=int(port))
        url = envoy.start()
        stack.callback(envoy.stop)
        with urllib.request.urlopen(f"http://{replicas[0]['address']}/v1/models", timeout=5) as r:
            model = json.load(r)["data"][0]["id"]
        full = [a.replace("{url}", url).replace("{model}", model) for a in cmd]
        print(json.dumps({"event": "listening", "envoy": url, "model": model, "picker_metrics": picker.info["metrics"],
                          "replicas": [r["address"] for r in replicas], "command": full}), file=sys.stderr, flush=True)
        before = _snapshot(replicas, picker.info["metrics"], envoy.admin_url)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(full, timeout=args.timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        wall = time.monotonic() - t0
        time.sleep(0.5)  # a replica counts a request after its last token, which the client already has
        out = summarise(before, _snapshot(replicas, picker.info["metrics"], envoy.admin_url), replicas, wall, rc)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
