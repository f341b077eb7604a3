"""Observability in the synthesized template: the add-on, its log groups, the collector, the alarms, the outputs."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml

from cdk_constructs.observability import ADDON_LOG_GROUPS, ADDON_NAME, AGENT_SERVICE_ACCOUNT
from serve_config import METRICS_PORT as RAY_METRICS_PORT  # what the Ray pods listen on
from serve_config.observability_payloads import alarm_queries, insights_queries, render_rules
from settings.estimates import HOURS_PER_MONTH, observability_monthly_cost, ray_series
from settings.model import Settings
from settings.rules import validate
from tests.conftest import manifests, only, resources, synth
from tests.support.cfn_lint import lint_errors
from tests.support.template_graph import depends_on

CLUSTER = "pd-inference"
# The log groups the add-on writes (chart amazon-cloudwatch-observability 6.4.0 values.yaml:
# Fluent Bit's `log_group_name` application, dataplane, host; the agent's EMF performance events).
ADDON_WRITES = {
    f"/aws/containerinsights/{CLUSTER}/{kind}" for kind in ("application", "dataplane", "host", "performance")
}


def _logical_id(template: dict[str, Any], type_: str, **match: Any) -> str:
    found = [
        k
        for k, r in resources(template, type_).items()
        if all(r.get("Properties", {}).get(key) == value for key, value in match.items())
    ]
    assert len(found) == 1, (type_, match, found)
    return found[0]


def _logs_key(template: dict[str, Any]) -> str:
    return next(k for k in resources(template, "AWS::KMS::Key") if k.startswith("LogsKey"))


def test_the_addon_runs_with_its_own_pod_identity_role_and_gpu_and_efa_metrics() -> None:
    template = synth()
    addon = only(template, "AWS::EKS::Addon", AddonName=ADDON_NAME)["Properties"]
    (association,) = addon["PodIdentityAssociations"]
    assert association["ServiceAccount"] == AGENT_SERVICE_ACCOUNT
    role = template["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    (policy,) = role["ManagedPolicyArns"]
    assert "CloudWatchAgentServerPolicy" in json.dumps(policy)
    kubernetes = json.loads(addon["ConfigurationValues"])["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"]
    # Without these the agent's translator declares no node_gpu_* / node_efa_* metrics (kubernetes.go).
    assert kubernetes == {"enhanced_container_insights": True, "accelerated_compute_metrics": True}


def test_every_log_group_the_addon_writes_is_the_stacks_own_encrypted_and_destroyed() -> None:
    template = synth()
    assert {f"/aws/containerinsights/{CLUSTER}/{kind}" for kind in ADDON_LOG_GROUPS} == ADDON_WRITES
    addon_id = _logical_id(template, "AWS::EKS::Addon", AddonName=ADDON_NAME)
    depends = set(template["Resources"][addon_id].get("DependsOn", []))
    for name in sorted(ADDON_WRITES):
        group_id = _logical_id(template, "AWS::Logs::LogGroup", LogGroupName=name)
        group = template["Resources"][group_id]
        assert group["DeletionPolicy"] == "Delete", name
        assert group["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [_logs_key(template), "Arn"]}, name
        assert group["Properties"]["RetentionInDays"] == 30, name
        # Made before the add-on starts writing, deleted after it stops.
        assert group_id in depends, name


def test_the_addon_waits_for_both_node_groups() -> None:
    template = synth()
    addon = template["Resources"][_logical_id(template, "AWS::EKS::Addon", AddonName=ADDON_NAME)]
    nodegroups = set(resources(template, "AWS::EKS::Nodegroup"))
    assert len(nodegroups) == 2
    assert nodegroups <= set(addon["DependsOn"])


def _scraper(template: dict[str, Any]) -> dict[str, Any]:
    (scraper,) = resources(template, "AWS::APS::Scraper").values()
    props: dict[str, Any] = scraper["Properties"]
    return props


def _scrape_config(template: dict[str, Any]) -> dict[str, Any]:
    blob = _scraper(template)["ScrapeConfiguration"]["ConfigurationBlob"]
    # Fn::Base64 over a join: the tokens become placeholders, the rest is the YAML CloudFormation encodes.
    parts = blob["Fn::Base64"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else "TOKEN" for p in parts)
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def test_the_collector_scrapes_the_ray_pods_metrics_port_in_the_serving_namespace() -> None:
    template = synth(serving_namespace="serving")
    config = _scrape_config(template)
    assert config["global"]["scrape_interval"] == "30s"
    (job,) = config["scrape_configs"]
    (sd,) = job["kubernetes_sd_configs"]
    assert sd == {"role": "pod", "namespaces": {"names": ["serving"]}}
    keeps = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keeps == {
        ("__meta_kubernetes_pod_label_ray_io_is_ray_node",): "yes",
        ("__meta_kubernetes_pod_container_port_name",): "metrics",
    }
    assert _scraper(template)["Destination"]["AmpConfiguration"]["WorkspaceArn"]["Fn::GetAtt"][1] == "Arn"


def test_the_scrape_interval_is_a_setting() -> None:
    assert _scrape_config(synth(observability_scrape_interval_seconds="60"))["global"]["scrape_interval"] == "60s"


def test_the_collector_config_is_base64_as_cloudformation_takes_it() -> None:
    blob = _scraper(synth())["ScrapeConfiguration"]["ConfigurationBlob"]
    assert list(blob) == ["Fn::Base64"]
    # What CloudFormation will hand the API: decodes back to the YAML.
    text = "".join(p if isinstance(p, str) else "arn" for p in blob["Fn::Base64"]["Fn::Join"][1])
    assert base64.b64decode(base64.b64encode(text.encode())).decode() == text


def test_the_collector_sits_in_the_private_subnets_of_two_azs_with_its_own_group() -> None:
    template = synth()
    eks_config = _scraper(template)["Source"]["EksConfiguration"]
    subnets = [ref["Ref"] for ref in eks_config["SubnetIds"]]
    private = {
        k
        for k, r in resources(template, "AWS::EC2::Subnet").items()
        if not r["Properties"].get("MapPublicIpOnLaunch") and "Private" in k
    }
    assert len(subnets) >= 2 and set(subnets) <= private
    azs = {json.dumps(template["Resources"][s]["Properties"]["AvailabilityZone"]) for s in subnets}
    assert len(azs) >= 2
    (group,) = eks_config["SecurityGroupIds"]
    assert group["Fn::GetAtt"][0].startswith("ObservabilityScraperSecurityGroup")


def test_one_rule_admits_the_collector_to_8080_and_only_on_the_cluster_group() -> None:
    """Its other rules are the EKS API's 443 (tests/test_scraper_reachability.py follows both paths)."""
    template = synth()
    scraper_group = _scraper(template)["Source"]["EksConfiguration"]["SecurityGroupIds"][0]["Fn::GetAtt"][0]
    rules = [
        r["Properties"]
        for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()
        if json.dumps(r["Properties"].get("SourceSecurityGroupId")).find(scraper_group) >= 0
        and r["Properties"]["FromPort"] != 443
    ]
    (rule,) = rules
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", RAY_METRICS_PORT, RAY_METRICS_PORT)
    assert rule["GroupId"] == {
        "Fn::GetAtt": [next(iter(resources(template, "AWS::EKS::Cluster"))), "ClusterSecurityGroupId"]
    }
    # And the collector's own group admits nothing.
    assert not template["Resources"][scraper_group]["Properties"].get("SecurityGroupIngress")


def test_the_rules_are_the_rendered_file_with_the_settings_thresholds() -> None:
    overrides = {"alarm_ttft_p99_seconds": "4.5", "alarm_kv_throughput_floor_gb_per_s": "2", "decode_replicas": "1"}
    template = synth(**overrides)
    (namespace,) = resources(template, "AWS::APS::RuleGroupsNamespace").values()
    data = namespace["Properties"]["Data"]
    assert data == render_rules(validate(Settings(alarm_ttft_p99_seconds=4.5, alarm_kv_throughput_floor_gb_per_s=2.0)))
    rules = {r["alert"]: r["expr"] for g in yaml.safe_load(data)["groups"] for r in g["rules"]}
    assert rules["TtftP99AboveTarget"].endswith("> 4.5")
    assert "< 2000000000 and" in rules["KvThroughputBelowFloor"]


def test_alerts_and_alarms_go_to_one_encrypted_topic_that_aps_and_cloudwatch_may_use() -> None:
    template = synth()
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    topic = template["Resources"][topic_id]["Properties"]
    key_id = topic["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key_statements = template["Resources"][key_id]["Properties"]["KeyPolicy"]["Statement"]
    services = {
        svc
        for st in key_statements
        if "kms:GenerateDataKey*" in st["Action"]
        for svc in json.dumps(st["Principal"]).split('"')
        if svc.endswith(".amazonaws.com")
    }
    assert {"aps.amazonaws.com", "cloudwatch.amazonaws.com"} <= services
    (policy,) = resources(template, "AWS::SNS::TopicPolicy").values()
    publish = [
        st
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
        if st.get("Principal") == {"Service": "aps.amazonaws.com"}
    ]
    assert publish and "sns:Publish" in publish[0]["Action"]
    (workspace,) = resources(template, "AWS::APS::Workspace").values()
    definition = workspace["Properties"]["AlertManagerDefinition"]["Fn::Join"][1]
    assert {"Ref": topic_id} in definition
    body = yaml.safe_load("".join(p if isinstance(p, str) else "x" for p in definition))
    config = json.loads(body["alertmanager_config"])
    assert config["route"]["receiver"] == "sns" and config["receivers"][0]["sns_configs"][0]["topic_arn"] == "x"
    for name, alarm in {
        **resources(template, "AWS::CloudWatch::Alarm"),
        **resources(template, "AWS::CloudWatch::CompositeAlarm"),
    }.items():
        actions = alarm["Properties"].get("AlarmActions", [])
        if name.startswith(("ObservabilityNodeNotReady", "ObservabilityKvOffEfa", "GcsStoreNoPrimary")):
            assert actions == [{"Ref": topic_id}], name
        else:
            # The composite's two halves notify only through it.
            assert actions == [], name


def test_an_email_subscription_only_when_set() -> None:
    assert not resources(synth(), "AWS::SNS::Subscription")
    (sub,) = resources(synth(alarm_email="oncall@example.com"), "AWS::SNS::Subscription").values()
    assert sub["Properties"]["Protocol"] == "email" and sub["Properties"]["Endpoint"] == "oncall@example.com"


def test_kv_off_efa_is_efa_flat_and_kv_sized_traffic_on_the_pod_network() -> None:
    template = synth()
    (composite,) = resources(template, "AWS::CloudWatch::CompositeAlarm").values()
    rule = json.dumps(composite["Properties"]["AlarmRule"])
    efa = next(k for k in resources(template, "AWS::CloudWatch::Alarm") if k.startswith("ObservabilityEfaFlat"))
    pod = next(k for k in resources(template, "AWS::CloudWatch::Alarm") if k.startswith("ObservabilityKvSized"))
    assert efa in rule and pod in rule and "AND" in rule
    efa_props = template["Resources"][efa]["Properties"]
    assert efa_props["ComparisonOperator"] == "LessThanThreshold" and efa_props["Threshold"] == 10_000
    assert "node_efa_rx_bytes" in efa_props["Metrics"][0]["Expression"]


@pytest.mark.parametrize(
    "type_",
    [
        "AWS::EKS::Addon",
        "AWS::APS::Workspace",
        "AWS::APS::Scraper",
        "AWS::CloudWatch::Dashboard",
        "AWS::SNS::Topic",
        "AWS::CloudWatch::CompositeAlarm",
    ],
)
def test_observability_off_leaves_none_of_it(type_: str) -> None:
    found = resources(synth(observability="false"), type_)
    if type_ == "AWS::EKS::Addon":
        assert ADDON_NAME not in {r["Properties"]["AddonName"] for r in found.values()}
    else:
        assert not found


def test_the_outputs_name_the_dashboard_the_workspace_and_the_import_command() -> None:
    template = synth()
    outputs = template["Outputs"]
    url = outputs["DashboardUrl"]["Value"]["Fn::Join"][1]
    dashboard_id = _logical_id(template, "AWS::CloudWatch::Dashboard", DashboardName=f"{CLUSTER}-serving")
    assert url[-2:] == ["#dashboards:name=", {"Ref": dashboard_id}]
    assert outputs["PrometheusQueryUrl"]["Value"]["Fn::GetAtt"][1] == "PrometheusEndpoint"
    assert "tools.import_dashboard" in json.dumps(outputs["GrafanaImportCommand"]["Value"])
    assert "AlarmTopicArn" in outputs
    assert not {"DashboardUrl", "PrometheusQueryUrl"} & set(synth(observability="false")["Outputs"])


def test_the_monthly_estimate_counts_the_measured_series_at_the_interval() -> None:
    s = validate(Settings())
    # The head's 1333, the ingress pod's 864 and 1231 per engine pod (tests/test_estimates.py derives them
    # from the recorded pd scrape and the RayService's pods), every 30 s for 730 h.
    assert ray_series(s) == 4659
    lines = {line.item: (line.per_hour or 0) * HOURS_PER_MONTH for line in observability_monthly_cost(s)}
    (ingestion,) = [cost for item, cost in lines.items() if item.startswith("managed Prometheus ingestion")]
    assert ingestion == pytest.approx(4659 * 730 * 3600 / 30 / 1e7 * 0.90)
    slower = validate(Settings(observability_scrape_interval_seconds=60))
    assert sum(line.per_hour or 0 for line in observability_monthly_cost(slower)) < sum(lines.values()) / 730
    assert observability_monthly_cost(validate(Settings(observability=False))) == []
    assert synth()["Outputs"]["EstimatedObservabilityPerMonth"]["Value"].startswith("observability ~$88/month")


def test_cfn_lint_is_clean_with_the_email_and_another_interval_and_with_observability_off() -> None:
    assert lint_errors(synth(alarm_email="oncall@example.com", observability_scrape_interval_seconds="60")) == []
    assert lint_errors(synth(observability="false")) == []


def test_the_collector_may_list_the_serving_namespaces_pods_and_nothing_else() -> None:
    template = synth(serving_namespace="serving")
    rbac = [m for m in manifests(template) if m["kind"] in ("Role", "RoleBinding", "ClusterRoleBinding")]
    bound = [m for m in rbac if any(s.get("name") == "aps-collector-user" for s in m.get("subjects", []))]
    (binding,) = bound
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == "serving"
    (role,) = [m for m in rbac if m["kind"] == "Role" and m["metadata"]["name"] == binding["roleRef"]["name"]]
    assert role["metadata"]["namespace"] == "serving"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    # Applied after the namespace exists.
    rbac_id = next(
        k
        for k, r in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").items()
        if "aps-collector-user" in json.dumps(r["Properties"]["Manifest"])
    )
    namespace_id = next(
        k
        for k, r in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").items()
        if '"kind":"Namespace"' in json.dumps(r["Properties"]["Manifest"], separators=(",", ":")).replace("\\", "")
    )
    assert depends_on(template, rbac_id, namespace_id)


def test_the_cloudwatch_dashboard_and_alarms_run_the_checked_queries() -> None:
    template = synth()
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = json.loads(
        "".join(p if isinstance(p, str) else "REGION" for p in dashboard["Properties"]["DashboardBody"]["Fn::Join"][1])
    )
    expressions = [m[0]["expression"] for w in body["widgets"] for m in w["properties"]["metrics"]]
    assert sorted(expressions) == sorted(sql for _, sql in insights_queries(CLUSTER, "llm").values())
    alarmed = {
        m["Expression"]
        for name, a in resources(template, "AWS::CloudWatch::Alarm").items()
        if name.startswith("Observability")
        for m in a["Properties"]["Metrics"]
    }
    assert alarmed == {sql for _, sql in alarm_queries(CLUSTER, "llm").values()}
