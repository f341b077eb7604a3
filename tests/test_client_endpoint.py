"""The clients' endpoint: the ingress group's pods and no other, whichever Ray cluster serves.

KubeRay 1.7 labels every worker pod of a RayService ray.io/serve=true (pod.go, BuildPod), and
Serve runs a proxy on every node that holds a replica: a Service selecting that label reaches the
GPU workers' proxies, where a stream dies with its node with no error event. The pods and their
labels are KubeRay's, from the synthesized RayService (tests/placement.py ray_workloads); the
Services are the template's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import serve_config
from serve_config import GPU_RESOURCE, INGRESS_GROUP, SERVE_PORT
from settings import Settings
from tests.conftest import manifest_resource, manifests, rayservice_from, synth
from tests.support import placement
from tests.support.bench_result import RESULT
from tests.support.cluster import placed
from tests.support.fake_cluster import FakeCluster, install
from tools import bench, bench_results, verify

SERVICE = "pd-llm"
NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
# A range on decode too: more GPU groups' pods, Ray's autoscaler on.
VARIANTS = {
    "defaults": {},
    "nlb": NLB,
    "nlb-range": {**NLB, "decode_max_replicas": 3, "decode_target_ongoing_requests": 8},
}


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """A Service's selector: every key equal (Kubernetes Service semantics, no expressions)."""
    return all(labels.get(key) == value for key, value in selector.items())


def reached(selector: Mapping[str, str], pods: list[placement.Workload]) -> set[str]:
    return {pod.name for pod in pods if selects(selector, pod.labels)}


def gpu_pods(pods: list[placement.Workload]) -> set[str]:
    return {pod.name for pod in pods if placement.pod_requests(pod.spec).get(GPU_RESOURCE, 0.0) > 0}


def client_services(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every Service the stack applies, by name: each is a client endpoint (KubeRay makes the others)."""
    return {m["metadata"]["name"]: m for m in manifests(template) if m["kind"] == "Service"}


@pytest.mark.parametrize("overrides", list(VARIANTS.values()), ids=list(VARIANTS))
def test_each_client_endpoint_selects_exactly_the_ingress_groups_pods(overrides: dict[str, Any]) -> None:
    template = synth(**overrides)
    pods = placement.ray_workloads(rayservice_from(template))
    gpu = gpu_pods(pods)
    assert gpu >= {f"{SERVICE}/prefill", f"{SERVICE}/decode"}, "no GPU worker modelled: the check would be vacuous"
    services = client_services(template)
    expected = {f"{SERVICE}-ingress"} | ({f"{SERVICE}-internal"} if overrides else set())
    assert set(services) == expected
    for name, service in services.items():
        selector = service["spec"]["selector"]
        assert not reached(selector, pods) & gpu, f"{name} reaches a GPU worker's Serve proxy"
        assert reached(selector, pods) == {f"{SERVICE}/{INGRESS_GROUP}"}, name
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [SERVE_PORT], name


@pytest.mark.parametrize("overrides", [NLB], ids=["nlb"])
def test_the_placement_proof_puts_every_endpoint_pod_on_a_system_node(overrides: dict[str, Any]) -> None:
    """Where the placement proof lands the pods each client Service selects: system nodes only."""

    result = placed(**overrides)
    pods = placement.ray_workloads(rayservice_from(synth(**overrides)))
    system = {n.group for n in result.nodes if n.labels.get("role") == "system"}
    for name, service in client_services(synth(**overrides)).items():
        selected = reached(service["spec"]["selector"], pods)
        assert selected and all(result.placed[pod] and result.groups_of(pod) == system for pod in selected), name


def test_the_check_fails_on_a_selector_every_serving_pod_matches() -> None:
    """What the endpoints must not be: the NLB's old selector and KubeRay's own serve Service's
    (service.go, BuildServeService: ray.io/cluster and ray.io/serve=true) reach both GPU groups and
    the head."""
    pods = placement.ray_workloads(rayservice_from(synth()))
    everything = {pod.name for pod in pods}
    old_nlb = {**serve_config.pod_labels(Settings()), "ray.io/serve": "true"}
    kuberay_serve_svc = {"ray.io/cluster": f"{SERVICE}-x7k2p", "ray.io/serve": "true"}
    for selector in (old_nlb, kuberay_serve_svc):
        assert reached(selector, pods) == everything
        assert reached(selector, pods) & gpu_pods(pods) == {f"{SERVICE}/prefill", f"{SERVICE}/decode"}


def test_the_endpoint_follows_a_cluster_built_under_another_name() -> None:
    """KubeRay names each RayCluster it builds anew (a rebuild, blue/green): the selector names none."""
    template = synth(**NLB)
    rayservice = rayservice_from(template)
    old = placement.ray_workloads(rayservice, cluster_name=f"{SERVICE}-x7k2p")
    new = placement.ray_workloads(rayservice, cluster_name=f"{SERVICE}-b9q4z")
    both = [*old, *new]
    for name, service in client_services(template).items():
        selector = service["spec"]["selector"]
        assert "ray.io/cluster" not in selector, name
        matched = [pod for pod in both if selects(selector, pod.labels)]
        assert {pod.labels["ray.io/cluster"] for pod in matched} == {f"{SERVICE}-x7k2p", f"{SERVICE}-b9q4z"}
        assert {pod.labels["ray.io/group"] for pod in matched} == {INGRESS_GROUP}, name


def test_the_port_forward_output_names_the_ingress_service(template: dict[str, Any]) -> None:
    command = template["Outputs"]["PortForwardCommand"]["Value"]
    assert command == f"kubectl -n llm port-forward svc/{SERVICE}-ingress {SERVE_PORT}:{SERVE_PORT}"
    assert f"{SERVICE}-ingress" in client_services(template)


def test_the_ingress_service_is_applied_after_the_namespace(template: dict[str, Any]) -> None:
    """And so deleted before it (and before the cluster, whose kubectl provider applies it)."""

    service = template["Resources"][manifest_resource(template, "Service", f"{SERVICE}-ingress")]
    assert manifest_resource(template, "Namespace") in service["DependsOn"]


def test_verify_and_bench_forward_to_the_ingress_service(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    forwarded: list[str] = []

    @contextlib.contextmanager
    def port_forward(settings: Settings, service: str, remote_port: int) -> Iterator[str]:
        forwarded.append(f"{service}:{remote_port}")
        yield "http://fake"

    def vllm_bench(command: list[str], check: bool, env: dict[str, str]) -> None:
        result_dir = Path(command[command.index("--result-dir") + 1])
        (result_dir / command[command.index("--result-filename") + 1]).write_text(json.dumps(RESULT))

    cluster = install(monkeypatch, FakeCluster())
    monkeypatch.setattr(verify, "port_forward", port_forward)
    verify.run_checks(Settings())
    monkeypatch.setattr(bench, "port_forward", port_forward)
    monkeypatch.setattr(bench, "worker_pods", lambda s: {"decode": [{"metadata": {"name": "w-decode"}}]})
    monkeypatch.setattr(bench, "metrics_text", lambda namespace, pod: "")
    monkeypatch.setattr("tools.cluster_access.kubectl", cluster.kubectl)
    monkeypatch.setattr("tools.bench.subprocess.run", vllm_bench)
    bench.sweep(Settings(), [bench_results.Point(128, 1)], 16, 4, tmp_path, "disaggregated")
    # verify: its checks' requests, then the short prompt once the counters settled; bench: its sweep.
    assert forwarded == [f"{SERVICE}-ingress:{SERVE_PORT}"] * 3
