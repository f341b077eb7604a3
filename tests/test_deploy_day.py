"""Deploy-day defects found by reading the sources: each test failed on the main before the fix."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import serve_config
from cdk_constructs.llm_service import cluster_recreate, ray_pod_labels
from serve_config import pod_templates
from settings.catalog import AWS_LOAD_BALANCER_CONTROLLER, EXTERNAL_SECRETS, KUBERAY_OPERATOR
from tests.conftest import ROOT, helm_releases, manifest_resource, manifests, only, rayservice_from, resources, synth
from tests.support.helm import rendered_releases
from tests.support.template_graph import depends_on
from tools.pr_guard import impact_summary

TOKEN = {"hf_token_secret_name": "prod/hf-token"}
NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}


def _release(template: dict[str, Any], release: str) -> dict[str, Any]:
    props: dict[str, Any] = template["Resources"][helm_releases(template)[release]]["Properties"]
    return props


# --- 1. releases with fail-closed webhooks wait for them --------------------------------


def test_webhook_releases_wait() -> None:
    template = synth(**TOKEN, **NLB)
    assert _release(template, EXTERNAL_SECRETS.release)["Wait"] is True
    assert _release(template, AWS_LOAD_BALANCER_CONTROLLER.release)["Wait"] is True


def test_no_fail_closed_webhook_intercepts_every_service() -> None:
    """Rendered with our values, the controller's chart registers no Service webhook that fails closed."""
    rendered = rendered_releases(synth(**NLB), "1.36")[AWS_LOAD_BALANCER_CONTROLLER.release]
    for obj in rendered:
        for hook in obj.get("webhooks", []) if obj["kind"].endswith("WebhookConfiguration") else []:
            services = any("services" in rule.get("resources", []) for rule in hook.get("rules", []))
            assert not (services and hook.get("failurePolicy") == "Fail" and not hook.get("namespaceSelector")), hook


def test_whatever_creates_services_comes_after_the_controller() -> None:
    template = synth(**TOKEN, **NLB)
    releases = helm_releases(template)
    controller = releases[AWS_LOAD_BALANCER_CONTROLLER.release]
    for name, logical_id in releases.items():
        if name != AWS_LOAD_BALANCER_CONTROLLER.release:
            assert depends_on(template, logical_id, controller), name
    assert depends_on(template, manifest_resource(template, "RayService"), controller)
    assert depends_on(template, manifest_resource(template, "SecretStore"), releases[EXTERNAL_SECRETS.release])


# --- 4. huge pages --------------------------------------------------------------------


def test_workers_use_regular_pages_and_log_nixl_at_info(rayservice: dict[str, Any]) -> None:
    # The GPU groups, which move KV; the ingress group moves none.
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][:2]:
        container = group["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["FI_EFA_USE_HUGE_PAGE"] == "0"
        assert env["NIXL_LOG_LEVEL"] == "INFO"
        assert not any(k.startswith("hugepages-") for k in container["resources"]["requests"])


# --- 6. the kubectl provider on a security group the stack owns -------------------------


def test_kubectl_provider_lambdas_use_a_stack_owned_security_group(template: dict[str, Any]) -> None:
    groups = resources(template, "AWS::EC2::SecurityGroup")
    in_vpc = [f for f in resources(template, "AWS::Lambda::Function").values() if "VpcConfig" in f["Properties"]]
    assert in_vpc
    for function in in_vpc:
        ids = function["Properties"]["VpcConfig"]["SecurityGroupIds"]
        assert ids and all("Fn::GetAtt" in i and i["Fn::GetAtt"][0] in groups for i in ids), ids
        assert "ClusterSecurityGroupId" not in json.dumps(ids)
    # The group may reach the API server's private endpoint.
    (provider_group,) = [k for k in groups if "KubectlProvider" in k]
    ingress = [
        r["Properties"]
        for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"].get("SourceSecurityGroupId", {}).get("Fn::GetAtt", [None])[0] == provider_group
    ]
    assert any(r["FromPort"] == 443 for r in ingress)


# --- 7. the public API endpoint ---------------------------------------------------------


def test_public_access_cidrs_reach_the_cluster() -> None:
    template = synth(public_access_cidrs="203.0.113.0/24,198.51.100.0/24")
    vpc_config = only(template, "AWS::EKS::Cluster")["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["PublicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.0/24"]


def test_synth_warns_in_one_line_each_of_an_open_endpoint_and_an_upgrade_with_downtime(tmp_path: Any) -> None:
    """On the defaults: the API endpoint is open to the world, two fixed GPU nodes hold no second Ray cluster, and
    neither side has room for a surge replica."""
    env = {"CDK_OUTDIR": str(tmp_path), "PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin"}
    result = subprocess.run(
        ["python", "app.py"], cwd=ROOT, env={**env, "CDK_VALIDATION": "false"}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 3, warnings
    assert "0.0.0.0/0" in warnings[0] and "public_access_cidrs" in warnings[0]
    assert "cannot hold a second Ray cluster" in warnings[1] and "a maximum of 4 or more" in warnings[1]
    assert "no room for a surge replica on prefill and decode" in warnings[2] and "make upgrade" in warnings[2]


# --- 8. the Jobs' kubectl gets a writable HOME -------------------------------------------


def test_every_kubectl_job_has_a_writable_home(template: dict[str, Any]) -> None:
    jobs = [m for m in manifests(template) if m["kind"] == "Job"]
    assert len(jobs) == 2  # the CRD upgrade and the Ray cluster recreate
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            home = {e["name"]: e["value"] for e in container["env"]}["HOME"]
            # HOME is exactly a mount point, mounted read-write, of a volume the pod may write.
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == home]
            assert mount.get("readOnly", False) is False, mount
            assert "emptyDir" in volumes[mount["name"]], volumes[mount["name"]]


# --- 9. checkov: only aws-cdk's own kubectl-provider Lambdas fail ----------------------------


def test_checkov_fails_only_on_the_kubectl_provider_lambdas(template: dict[str, Any], tmp_path: Any) -> None:
    checkov = ROOT / ".venv-checkov" / "bin" / "checkov"
    assert checkov.exists(), "checkov is not installed: run `make test` (it installs .venv-checkov)"
    path = tmp_path / "template.json"
    path.write_text(json.dumps(template))
    result = subprocess.run(
        [str(checkov), "-f", str(path), "--framework", "cloudformation", "--quiet", "--compact", "-o", "json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    report = json.loads(result.stdout)
    failed = {(f["check_id"], f["resource"].split(".", 1)[1]) for f in report["results"]["failed_checks"]}
    lambdas = {k for k in resources(template, "AWS::Lambda::Function") if "KubectlProvider" in k}
    assert len(lambdas) == 2
    assert {check for check, _ in failed} == {"CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_173"}, failed
    assert {resource for _, resource in failed} == lambdas
    print(f"checkov {report['summary']}")


# --- 10. the hand-off page ---------------------------------------------------------------


def test_hand_off_readme_says_the_template_needs_an_s3_bucket(template: dict[str, Any]) -> None:
    assert len(json.dumps(template)) > 51_200
    page = (ROOT / "docs" / "getting-started.md").read_text()
    section = page.split("## Handing the stack to a platform team", 1)[1].split("\n## ", 1)[0]
    assert "--s3-bucket" in section and "51,200" in section


# --- 19. a change to the Ray cluster reaches a deployed stack ------------------------------


def test_a_cluster_spec_change_makes_a_new_recreate_job() -> None:
    base, changed = synth(), synth(gpu_memory_utilization="0.85", max_model_len="4096")
    serve_only = rayservice_from(changed)  # serveConfigV2 changes only: no recreate
    assert pod_templates.cluster_config_hash(rayservice_from(base)) == pod_templates.cluster_config_hash(serve_only)
    resized = synth(ray_image="public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0")

    def job_name(template: dict[str, Any]) -> str:
        (job,) = [m for m in manifests(template) if m["kind"] == "Job" and "recreate" in m["metadata"]["name"]]
        return str(job["metadata"]["name"])

    assert job_name(base) == job_name(changed)
    assert job_name(base) != job_name(resized)


def test_recreate_job_deletes_only_a_cluster_and_pods_built_from_another_spec(rayservice: dict[str, Any]) -> None:
    config_hash = rayservice["metadata"]["labels"][serve_config.CLUSTER_CONFIG_LABEL]
    assert config_hash == pod_templates.cluster_config_hash(rayservice)
    docs = cluster_recreate(
        namespace="llm",
        service_name="pd-llm",
        pod_labels=ray_pod_labels(rayservice),
        config_hash=config_hash,
        system_node_labels={"role": "system"},
    )
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    # The RayCluster first, then the pods (tests/test_cluster_recreate.py runs them through KubeRay's paths).
    (clusters,) = [c["args"] for c in pod["initContainers"]]
    (pods,) = [c["args"] for c in pod["containers"]]
    assert clusters[:2] == ["delete", "rayclusters.ray.io"] and pods[:2] == ["delete", "pods"]
    stale = f"{serve_config.CLUSTER_CONFIG_LABEL}!={config_hash}"
    assert clusters[clusters.index("--selector") + 1] == f"ray.io/originated-from-cr-name=pd-llm,{stale}"
    assert pods[pods.index("--selector") + 1] == f"app.kubernetes.io/name=pd-llm,ray.io/is-ray-node=yes,{stale}"
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
    ]


def test_recreate_job_runs_after_the_rayservice(template: dict[str, Any]) -> None:
    job = manifest_resource(template, "Job", name_prefix="raycluster-recreate-")
    assert depends_on(template, job, manifest_resource(template, "RayService"))
    assert depends_on(template, job, manifest_resource(template, "Role", name_prefix="raycluster-recreator"))


def test_the_operator_is_not_waited_on_needlessly(template: dict[str, Any]) -> None:
    """Only releases with fail-closed webhooks wait; KubeRay's operator has none."""
    assert _release(template, KUBERAY_OPERATOR.release).get("Wait") in (None, False)


def test_the_pr_comment_says_when_the_ray_cluster_is_recreated() -> None:
    """A new image leaves the serve config alone: no Ray is needed to tell (tests/test_change_impact.py)."""

    note = impact_summary(
        synth(), synth(ray_image="public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0"), []
    )
    assert note.startswith("**Interruption: a new Ray cluster.** The recreate Job deletes the running RayCluster")
