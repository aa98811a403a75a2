"""One list per concept (controller/names.py): the config, the command line, the registry, the bench and
the documented example config all accept exactly its names, so a name added there is accepted everywhere
and a reader that keeps its own copy fails here."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from controller import names
from controller.cli import build_parser
from controller.config import ConfigError, Settings, parse_settings
from controller.config.sections import PoolSettings, ScrapeTargetSettings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = (ROOT / "deploy" / "governor.example.yaml").read_text()

BASE = """\
pools:
  - name: a
    model: llama-3-8b
    sku: h100-80gb
    usd_per_gpu_hour: 3.0
"""


def _literal(annotation: object) -> tuple[str, ...]:
    return typing.get_args(annotation)


def _choices(parser, *path: str) -> tuple[str, ...] | None:
    """The `choices` of the option `path[-1]` of the subcommand `path[:-1]`."""
    for name in path[:-1]:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[name]
    act = next(a for a in parser._actions if path[-1] in a.option_strings)
    return tuple(act.choices) if act.choices is not None else None


def _help(parser, *path: str) -> str:
    for name in path[:-1]:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[name]
    return next(a for a in parser._actions if path[-1] in a.option_strings).help or ""


# --------------------------------------------------------------------------- policies


@pytest.mark.parametrize("name", names.POLICY_NAMES)
def test_every_policy_name_is_a_valid_config(name):
    assert parse_settings(BASE + f"policy: {name}\n").policy == name


def test_the_config_refuses_a_name_not_in_the_list_and_lists_them():
    with pytest.raises(ConfigError) as e:
        parse_settings(BASE + "policy: mpc2\n")
    assert all(f"'{n}'" in str(e.value) for n in names.POLICY_NAMES), str(e.value)


def test_the_config_command_line_registry_and_bench_read_the_one_list():
    from controller.bench import report, side_by_side
    from controller.policies import registry
    from controller.runtime import main

    assert _literal(Settings.model_fields["policy"].annotation) == names.POLICY_NAMES
    assert tuple(registry._policy_classes()) == names.POLICY_NAMES
    assert registry.POLICY_NAMES is names.POLICY_NAMES and main.POLICY_NAMES is names.POLICY_NAMES
    help_text = _help(build_parser(), "run", "--policy")
    assert all(n in help_text for n in names.POLICY_NAMES), help_text
    for n in names.POLICY_NAMES:  # `bench policies --policies NAME`
        assert side_by_side.resolve(n) == (n, {})
    assert tuple(n for n in names.POLICY_NAMES if n not in names.GOVERNOR_POLICIES) == report.BASELINE_BASES
    assert set(names.GOVERNOR_POLICIES) <= set(names.POLICY_NAMES)


@pytest.mark.parametrize("name", names.POLICY_NAMES)
def test_governor_run_policy_gives_a_config_that_validates(name):
    """`governor run --policy NAME` lays NAME over the config; the result must be a config that validates
    (`--policy llm-d-stack` used to give one that `Settings(policy=...)` refused)."""
    from controller.runtime.main import _with_policy

    settings = _with_policy(parse_settings(BASE), name)
    assert Settings(**settings.model_dump(mode="json")).policy == name


def test_the_example_config_documents_every_policy():
    line = next(i for i, x in enumerate(EXAMPLE.splitlines()) if x.startswith("# The planner:"))
    text = " ".join(EXAMPLE.splitlines()[line:line + 3])
    assert all(f" {n} " in text.replace("|", " ").replace(".", " ") for n in names.POLICY_NAMES), text


# --------------------------------------------------------------------------- profiles


def test_every_reader_of_a_profile_reads_the_one_list():
    from controller.api import store
    from controller.core import objective

    assert _literal(Settings.model_fields["profile"].annotation) == names.PROFILES
    assert set(objective.PROFILES) == set(names.PROFILES)  # one weight set per profile
    for n in names.PROFILES:
        objective.resolve_weights(n, None)
    assert store.PROFILES is names.PROFILES
    assert _choices(build_parser(), "bench", "policies", "--profile") == names.PROFILES
    assert f"# {' | '.join(names.PROFILES)}. Default: balanced." in EXAMPLE


# --------------------------------------------------------------------------- engine kinds


def test_every_reader_of_an_engine_kind_reads_the_one_list():
    from controller.actuation.kube import ENGINE_FLAGS
    from controller.sim.scenario import EngineSpec
    from controller.telemetry import source

    assert _literal(PoolSettings.model_fields["engine"].annotation) == names.ENGINE_KINDS
    assert _literal(ScrapeTargetSettings.model_fields["kind"].annotation) == names.TARGET_KINDS
    assert names.TARGET_KINDS[:len(names.ENGINE_KINDS)] == names.ENGINE_KINDS
    assert source.ENGINE_KINDS is names.ENGINE_KINDS and source.TARGET_KINDS is names.TARGET_KINDS
    assert tuple(ENGINE_FLAGS) == names.ENGINE_KINDS  # each engine's batch-cap flags
    assert _literal(EngineSpec.model_fields["exposition"].annotation) == names.ENGINE_KINDS
    assert f"# Inference engine: {' | '.join(names.ENGINE_KINDS)}. Default: vllm." in EXAMPLE


# --------------------------------------------------------------------------- metric names per exporter


def _table_names() -> list[str]:
    import dataclasses

    from controller.metrics import series

    out = [n for e in series.ENGINES.values() for f in dataclasses.fields(e) for n in getattr(e, f.name)]
    out += [getattr(series.DCGM, f.name) for f in dataclasses.fields(series.DCGM)]
    out += [n for f in dataclasses.fields(series.ROUTER) for n in getattr(series.ROUTER, f.name)]
    return out


def test_the_series_table_has_one_entry_per_engine_kind_and_the_docs_name_every_series():
    from controller.metrics import series

    assert tuple(series.ENGINES) == names.ENGINE_KINDS
    doc = (ROOT / "docs" / "TELEMETRY.md").read_text()
    wildcards = [w[:-1] for w in re.findall(r"`([a-z_]+_\*)`", doc)]
    undocumented = [n for n in _table_names()
                    if n not in doc and n.removesuffix("_total") not in doc
                    and not any(n.startswith(w) for w in wildcards)]
    assert not undocumented, f"docs/TELEMETRY.md does not name {undocumented}"


def test_every_reader_reads_its_names_from_the_series_table():
    """The queries, the scrape window and the picker ask for exactly the table's names, and the simulator
    serves the current name of each engine series it exports (so Governor reads what it serves)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from controller.dataplane import scrape as picker_scrape
    from controller.metrics import promql, series
    from controller.sim.exposition import ReplicaCollector
    from controller.sim.exposition_sglang import SglangReplicaCollector
    from controller.sim.stats import ReplicaStats
    from controller.telemetry.window import read_sample_names

    table = set(_table_names())
    queried = set(re.findall(r"\b((?:vllm|sglang):[a-z_]+|DCGM_FI_[A-Z_]+|llm_d_epp_[a-z_]+|inference_[a-z_]+)",
                             " ".join(s.template for s in promql.QUERIES.values())))
    queried = {re.sub(r"_(bucket|count)$", "", n) for n in queried}
    assert queried == table, (sorted(queried - table), sorted(table - queried))
    window = {re.sub(r"_(bucket|count|sum)$", "", n)
              for kind in names.TARGET_KINDS for n in read_sample_names(kind)}
    assert window == table
    assert set(picker_scrape._RUNNING + picker_scrape._WAITING + picker_scrape._KV) == set(
        series.every_engine("running") + series.every_engine("waiting") + series.every_engine("kv_usage"))

    stats = ReplicaStats(replica_id="r0", pool="p", model_name="m", node_id="n0", gpu_indices=(0,), num_gpu_blocks=100,
                         block_size=16, gpu_memory_utilization=0.9)
    for collector, engine in ((ReplicaCollector(stats), series.VLLM), (SglangReplicaCollector(stats), series.SGLANG)):
        registry = CollectorRegistry()
        registry.register(collector)
        text = generate_latest(registry).decode()
        served = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
        for meaning in series.ENGINE_FIELDS:
            first = getattr(engine, meaning)[:1]
            for n in first:
                assert {n, f"{n}_bucket"} & served, f"the simulator does not serve {n} ({meaning})"
