"""The alerting rules as the stack renders them: run by Prometheus's own rule tester, and checked against
what really runs.

- NixlFailedTransfers and its panel, with `promtool test rules` (Debian 12's prometheus package, 2.42) on
  series shaped as vLLM 0.26 exports the failure counter: its Ray wrapper skips zero increments
  (vllm/v1/metrics/ray_wrappers.py, RayCounterWrapper.inc), so a series is born at 1 or more.
- Every settings placeholder of observability/rules.yaml, synthesized with a non-default value each, lands
  in its own rule.
- Every replica rule's `deployment` matcher selects its side's deployment, by Ray LLM's naming
  (serve_config.deployments.deployment_name_of) and in the recorded scrape of the running app.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from serve_config.deployments import deployment_name_of
from serve_config.observability_payloads import RULES_FILE, dashboard, render_rules
from settings import catalog
from settings.model import Settings
from settings.rules import validate
from tests.conftest import resources, synth
from tests.support.metric_names import recorded

FAILED = "ray_vllm_nixl_num_failed_transfers_total"
NIXL_ALERT = "NixlFailedTransfers"
NIXL_PANEL = "NIXL failed transfers"
REPLICAS = "ray_serve_deployment_replica_healthy"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: Debian's prometheus package provides it (.ci/run installs it)")
    return found


def _rules(text: str) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"]}


def _promtool_test(tmp_path: Path, rules_text: str, tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text(rules_text)
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run = subprocess.run(
        [_promtool(), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr


# --- NixlFailedTransfers, with promtool -------------------------------------------------------------
# One sample a minute. promtool's notation: '_x5' is 5 missing samples, '1x15' is 1 for 16 samples.
# decode-a: an engine's first failures, exported at 1 from minute 5 (no sample before: nothing was incremented).
# decode-b: that engine restarted (a new pod, a new series) and failed at once: born at 2 at minute 24.
# prefill: failed once before minute 0; its scrape stops for 12 minutes and comes back with the same
# value (no failure); then 3 more failures at minute 54.
NIXL_SERIES = [
    {"series": f'{FAILED}{{ray_group="decode", pod="decode-a"}}', "values": "_x5 1x15"},
    {"series": f'{FAILED}{{ray_group="decode", pod="decode-b"}}', "values": "_x24 2x10"},
    {"series": f'{FAILED}{{ray_group="prefill", pod="prefill-a"}}', "values": "1x30 _x12 1x10 4x5"},
]
# eval minute -> the sides that alert then.
NIXL_FIRES = {8: ["decode"], 12: [], 26: ["decode"], 45: [], 56: ["prefill"], 65: []}
# eval minute -> the panel's value per side ("" is the panel's fallback when no side has a series).
NIXL_PANEL_VALUES = {
    8: {"decode": 1, "prefill": 0},
    12: {"decode": 0, "prefill": 0},
    26: {"decode": 2, "prefill": 0},
    65: {"": 0},
}


def _nixl_alert_tests(rule: dict[str, Any], fires: dict[int, list[str]]) -> list[Any]:
    def alert(side: str) -> dict[str, Any]:
        return {"exp_labels": {**rule["labels"], "ray_group": side}, "exp_annotations": rule["annotations"]}

    return [
        {"eval_time": f"{minute}m", "alertname": rule["alert"], "exp_alerts": [alert(side) for side in sides]}
        for minute, sides in fires.items()
    ]


def _panel_query() -> str:
    (panel,) = [p for p in dashboard()["panels"] if p["title"] == NIXL_PANEL]
    (target,) = panel["targets"]
    query: str = target["expr"]
    return query


def test_a_new_failure_series_alerts_first_failures_and_after_a_restart_but_not_a_scrape_gap(tmp_path: Path) -> None:
    text = render_rules(validate(Settings()))
    rule = _rules(text)[NIXL_ALERT]
    test = {
        "interval": "1m",
        "input_series": NIXL_SERIES,
        "alert_rule_test": _nixl_alert_tests(rule, NIXL_FIRES),
    }
    _promtool_test(tmp_path, text, [test])


def test_no_failure_series_no_alert(tmp_path: Path) -> None:
    """A healthy engine never exports the failure counter (zero increments are skipped): nothing fires."""
    text = render_rules(validate(Settings()))
    rule = _rules(text)[NIXL_ALERT]
    healthy = [
        {"series": 'ray_vllm_nixl_xfer_time_seconds_count{ray_group="decode", pod="decode-a"}', "values": "0+3x60"}
    ]
    test = {
        "interval": "1m",
        "input_series": healthy,
        "alert_rule_test": _nixl_alert_tests(rule, {m: [] for m in (1, 5, 6, 10, 30, 60)}),
    }
    _promtool_test(tmp_path, text, [test])


def test_the_failures_panel_counts_a_new_series_and_shows_zero_without_any(tmp_path: Path) -> None:
    def samples(values: dict[str, int]) -> list[dict[str, Any]]:
        return [{"labels": f'{{ray_group="{side}"}}' if side else "{}", "value": v} for side, v in values.items()]

    query = _panel_query()
    test = {
        "interval": "1m",
        "input_series": NIXL_SERIES,
        "promql_expr_test": [
            {"expr": query, "eval_time": f"{minute}m", "exp_samples": samples(values)}
            for minute, values in NIXL_PANEL_VALUES.items()
        ],
    }
    _promtool_test(tmp_path, render_rules(validate(Settings())), [test])


def test_promtool_is_on_the_path_for_the_rule_tests() -> None:
    """The rule tests fail, never skip, on a machine without it."""
    run = subprocess.run([_promtool(), "--version"], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and "promtool, version 2." in run.stdout + run.stderr


# --- every placeholder lands in its rule ----------------------------------------------------------
# A non-default value for every setting a placeholder of rules.yaml renders, as `cdk synth -c` passes it.
OVERRIDES = {
    "alarm_ttft_p99_seconds": "4.5",
    "alarm_kv_throughput_floor_gb_per_s": "2.5",
    "alarm_kv_cache_usage_ratio": "0.9",
    "prefill_replicas": "3",
    "decode_replicas": "2",
    "serving_namespace": "serving",
}
# Each placeholder's text for OVERRIDES, written out here, not by the renderer.
RENDERED = {
    "TTFT_P99_TARGET_SECONDS": "4.5",
    "KV_THROUGHPUT_FLOOR_BYTES_PER_SECOND": "2500000000",
    "KV_CACHE_USAGE_ALARM_RATIO": "0.9",
    "PREFILL_REPLICAS": "3",
    "DECODE_REPLICAS": "2",
    "ALL_REPLICAS": "5",
    "NAMESPACE": "serving",
}
# Where each threshold sits in its rule's expression.
IN_EXPR = {
    "TtftP99AboveTarget": ") > 4.5",
    "KvThroughputBelowFloor": ") < 2500000000 and ",
    "KvCachePinned": ") > 0.9",
    "PrefillReplicasBelowMinimum": ") < 3 or absent(",
    "DecodeReplicasBelowMinimum": ") < 2 or absent(",
    "EngineReplicasBelowMinimum": ") < 5 or absent(",
}
_PLACEHOLDER = re.compile(r"\$\{([A-Z0-9_]+)\}")


def _fields(rule: dict[str, Any]) -> dict[str, str]:
    return {"expr": rule["expr"], **{f"annotations.{k}": v for k, v in rule.get("annotations", {}).items()}}


def _synthesized_rules(**overrides: str) -> dict[str, dict[str, Any]]:
    (namespace,) = resources(synth(**overrides), "AWS::APS::RuleGroupsNamespace").values()
    return _rules(namespace["Properties"]["Data"])


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_every_placeholder_is_its_setting_in_its_rule(mode: str) -> None:
    raw = _rules(RULES_FILE.read_text())
    assert set(_PLACEHOLDER.findall(RULES_FILE.read_text())) == set(RENDERED), "a placeholder without a case here"
    # Aggregated mode moves no KV: its floor is refused there as a setting with no effect.
    given = {k: v for k, v in OVERRIDES.items() if mode != "aggregated" or k != "alarm_kv_throughput_floor_gb_per_s"}
    rendered = _synthesized_rules(**given, serving_mode=mode)
    in_mode = {a for a, r in raw.items() if r.get("labels", {}).get("serving_mode", mode) == mode}
    assert set(rendered) == in_mode
    for alert, rule in rendered.items():
        if alert in IN_EXPR:
            # The value whole: "> 0.98" must not pass for "> 0.9".
            assert re.search(re.escape(IN_EXPR[alert]) + r"(?![0-9.])", rule["expr"]), (alert, rule["expr"])
        for field, text in _fields(raw[alert]).items():
            expected = _PLACEHOLDER.sub(lambda m: RENDERED[m.group(1)], text)
            assert _fields(rule)[field] == expected, (alert, field)


# --- each replica rule selects its side's deployment --------------------------------------------------
SIDE_OF = {
    "PrefillReplicasBelowMinimum": "prefill",
    "DecodeReplicasBelowMinimum": "decode",
    "EngineReplicasBelowMinimum": "aggregated",
}
# The recorded scrape is the pd rehearsal's, which serves under the default model's name.
RECORDED_MODEL = catalog.DEFAULT_MODEL_ID


def _deployment_matchers(expr: str) -> list[str]:
    """The deployment regex of every replica-health selector in one expression."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name == REPLICAS:
                (matcher,) = [m for m in node.matchers.matchers if m.name == "deployment"]
                assert str(matcher.op) == "MatchOp.Re", expr
                found.append(matcher.value)
            return
        for child in ("lhs", "rhs", "expr", "vector_selector"):
            if getattr(node, child, None) is not None:
                walk(getattr(node, child))
        for arg in getattr(node, "args", None) or []:
            walk(arg)

    walk(promql_parser.parse(expr))
    return found


def _recorded_deployments() -> set[str]:
    return {
        sample.labels["deployment"]
        for text in recorded()
        for family in text_string_to_metric_families(text)
        if family.name == REPLICAS
        for sample in family.samples
    }


def test_the_recorded_scrape_has_each_sides_replica_series_by_ray_llms_name() -> None:
    deployments = _recorded_deployments()
    for side in ("prefill", "decode"):
        assert deployment_name_of(RECORDED_MODEL, side) in deployments, deployments


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_each_replica_rule_selects_only_its_sides_deployment(mode: str) -> None:
    rules = _rules(render_rules(validate(Settings(serving_mode=mode))))
    replica_rules = {a: r for a, r in rules.items() if REPLICAS in r["expr"]}
    assert set(replica_rules) == {a for a, side in SIDE_OF.items() if (side == "aggregated") == (mode == "aggregated")}
    recorded_names = _recorded_deployments()
    for alert, rule in replica_rules.items():
        side = SIDE_OF[alert]
        matchers = _deployment_matchers(rule["expr"])
        assert len(matchers) == 2, (alert, rule["expr"])  # the sum and the absent()
        for regex in matchers:
            # PromQL anchors a regex matcher at both ends: fullmatch. Every model of the catalog.
            for model_id in catalog.MODELS:
                others = {deployment_name_of(model_id, s) for s in SIDE_OF.values() if s != side}
                assert re.fullmatch(regex, deployment_name_of(model_id, side)), (alert, regex, model_id)
                assert not any(re.fullmatch(regex, name) for name in others), (alert, regex, model_id)
            # And in what the running app exported: its side's series, and no other deployment's.
            in_scrape = {name for name in recorded_names if re.fullmatch(regex, name)}
            assert in_scrape == {deployment_name_of(RECORDED_MODEL, side)} & recorded_names, (alert, regex, in_scrape)
