"""A placement proof: the nodes EKS will create, every pod the cluster will run, and where each lands.

Small and explicit, not a scheduler: nodeSelector, required node affinity,
taints and tolerations, and resource requests against what is left on a node.
DaemonSets go first (they are system-node-critical), then everything else by
priority, highest first, in order within a priority (kube-scheduler's PrioritySort
queue), each replica on the eligible node with the most CPU left. A pod that fits
nowhere preempts, as kube-scheduler's DefaultPreemption does, pods of lower priority
only (never of equal or higher), unless its PriorityClass says preemptionPolicy
Never; the victims go back into the queue (Kubernetes docs, "Pod Priority and
Preemption"). Of the nodes where evicting lower-priority pods, lowest first, makes
room, the one whose highest victim has the lowest priority wins, then the fewest
victims: a simplification of the scheduler's pickOneNodeForPreemption, enough where
at most one kind of pod is preemptible.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_config import EFA_RESOURCE, GPU_RESOURCE
from settings.catalog import EFA_DEVICE_PLUGIN, INSTANCE_TYPES, NVIDIA_DEVICE_PLUGIN

GIB = 2**30
MIB = 2**20

# --- Nodes ----------------------------------------------------------------------------
# The kubelet sees a little less memory than the instance's nominal size (the
# kernel and firmware keep some): g6.8xlarge's 128 GiB shows as about 125 GiB. The same share
# is assumed for every type (an estimate).
MEMORY_SEEN_BY_KUBELET = 125 / 128
# nodeadm's hard eviction threshold, memory.available<100Mi (amazon-eks-ami nodeadm kubelet config).
EVICTION_HARD_MEMORY = 100 * MIB


def kube_reserved_cpu_millis(vcpus: int) -> float:
    """nodeadm: 6% of the first core, 1% of the second, 0.5% of the third and fourth, 0.25% of the rest."""
    shares = [60.0, 10.0, 5.0, 5.0]
    return sum(shares[: min(vcpus, 4)]) + max(vcpus - 4, 0) * 2.5


def kube_reserved_memory(max_pods: int) -> int:
    """nodeadm: 11 MiB per pod the node admits, plus 255 MiB."""
    return (11 * max_pods + 255) * MIB


def nodeadm_labels(ami_type: str, kubernetes_version: str) -> dict[str, str]:
    """Labels nodeadm adds by itself: nvidia.com/gpu.present on NVIDIA AMIs, from Kubernetes 1.35 on
    (amazon-eks-ami nodeadm/internal/kubelet/config.go)."""
    minor = int(kubernetes_version.split(".")[1])
    if "NVIDIA" in ami_type.upper() and minor >= 35:
        return {"nvidia.com/gpu.present": "true"}
    return {}


@dataclass
class Node:
    name: str
    group: str
    labels: dict[str, str]
    taints: list[dict[str, str]]
    # cpu in millicores, memory in bytes, pods, extended resources in units
    allocatable: dict[str, float]
    used: dict[str, float] = field(default_factory=dict)
    pods: list[str] = field(default_factory=list)
    # The pods bound here that are not a DaemonSet's, with their priority: what preemption may evict.
    evictable: list[Pod] = field(default_factory=list)

    def free(self, resource: str) -> float:
        return self.allocatable.get(resource, 0.0) - self.used.get(resource, 0.0)


_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


def nodes_from_template(
    template: Mapping[str, Any], kubernetes_version: str, *, at: str = "min", sizes: Mapping[str, int] | None = None
) -> list[Node]:
    """One Node per instance each managed node group runs at its minimum (or desired) size; sizes: these
    node groups (by logical id) at that many instances instead, within the group's MinSize and MaxSize."""
    nodes = []
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::EKS::Nodegroup":
            continue
        props = resource["Properties"]
        instance_type = props["InstanceTypes"][0]
        spec = INSTANCE_TYPES[instance_type]
        scaling = props["ScalingConfig"]
        count = scaling["MinSize"] if at == "min" else scaling["DesiredSize"]
        if sizes and logical_id in sizes:
            count = sizes[logical_id]
            if not scaling["MinSize"] <= count <= scaling["MaxSize"]:
                raise ValueError(f"{logical_id}: {count} nodes, outside {scaling['MinSize']}-{scaling['MaxSize']}")
        # Labels EKS puts on every managed node, plus ours and nodeadm's.
        labels = {
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": instance_type,
            "eks.amazonaws.com/nodegroup": logical_id,
            "eks.amazonaws.com/capacityType": "ON_DEMAND",
            **props.get("Labels", {}),
            **nodeadm_labels(props["AmiType"], kubernetes_version),
        }
        taints = [
            {"key": t["Key"], "value": t.get("Value", ""), "effect": _EFFECTS[t["Effect"]]}
            for t in props.get("Taints", [])
        ]
        memory = spec.memory_gib * GIB * MEMORY_SEEN_BY_KUBELET
        allocatable = {
            "cpu": spec.vcpus * 1000 - kube_reserved_cpu_millis(spec.vcpus),
            "memory": memory - kube_reserved_memory(spec.max_pods) - EVICTION_HARD_MEMORY,
            "pods": float(spec.max_pods),
        }
        for index in range(count):
            nodes.append(
                Node(
                    f"{logical_id}-{index}",
                    logical_id,
                    {**labels, "kubernetes.io/hostname": f"n{index}"},
                    taints,
                    dict(allocatable),
                )
            )
    return nodes


# --- Pods -----------------------------------------------------------------------------
# Kubernetes' own PriorityClasses (scheduling/types.go); any other must be in the cluster.
BUILTIN_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}


@dataclass(frozen=True)
class PriorityClass:
    value: int
    preempts: bool = True


def priority_classes(objects: Iterable[Mapping[str, Any]]) -> dict[str, PriorityClass]:
    """The PriorityClasses among these objects, and Kubernetes' built-in ones."""
    found = {name: PriorityClass(value) for name, value in BUILTIN_PRIORITY_CLASSES.items()}
    for obj in objects:
        if obj.get("kind") == "PriorityClass":
            preempts = obj.get("preemptionPolicy", "PreemptLowerPriority") != "Never"
            found[obj["metadata"]["name"]] = PriorityClass(int(obj["value"]), preempts)
    return found


@dataclass(frozen=True)
class Pod:
    """One replica of a workload, with the priority its class gives it (0 without a class)."""

    workload: str
    replica: int
    spec: Mapping[str, Any]
    priority: int
    preempts: bool


@dataclass(frozen=True)
class Workload:
    """Pods of one controller: a DaemonSet (one per eligible node) or `replicas` of one template."""

    name: str
    source: str
    spec: dict[str, Any]
    daemonset: bool = False
    replicas: int = 1
    # Where the pods run and the labels they carry (NetworkPolicies select by both).
    namespace: str = "default"
    labels: dict[str, str] = field(default_factory=dict)


_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def quantity(value: Any, resource: str) -> float:
    """A Kubernetes quantity in the units Node.allocatable uses (millicores for cpu, bytes otherwise)."""
    text = str(value)
    if resource == "cpu":
        return float(text[:-1]) if text.endswith("m") else float(text) * 1000
    for suffix, factor in _QUANTITY.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def pod_requests(spec: Mapping[str, Any]) -> dict[str, float]:
    """What the scheduler counts: the sum over containers, or the largest init container if larger."""
    totals: dict[str, float] = {}
    for container in spec.get("containers", []):
        for resource, value in _requests(container).items():
            totals[resource] = totals.get(resource, 0.0) + quantity(value, resource)
    for container in spec.get("initContainers", []):
        for resource, value in _requests(container).items():
            totals[resource] = max(totals.get(resource, 0.0), quantity(value, resource))
    totals["pods"] = 1.0
    return totals


def _requests(container: Mapping[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    # A limit without a request is also the request (Kubernetes defaults it).
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def workloads_from_objects(objects: Iterable[Mapping[str, Any]], source: str) -> list[Workload]:
    found = []
    for obj in objects:
        kind = obj.get("kind")
        metadata = obj.get("metadata", {})
        name = f"{kind}/{metadata.get('name')}"
        namespace = str(metadata.get("namespace") or "default")
        if kind == "Pod":
            found.append(
                Workload(name, source, obj["spec"], labels=dict(metadata.get("labels") or {}), namespace=namespace)
            )
            continue
        if kind not in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            continue
        template = obj["spec"]["template"]
        labels = dict(template.get("metadata", {}).get("labels") or {})
        if kind == "DaemonSet":
            found.append(Workload(name, source, template["spec"], daemonset=True, labels=labels, namespace=namespace))
        elif kind == "Job":
            found.append(Workload(name, source, template["spec"], labels=labels, namespace=namespace))
        else:
            replicas = obj["spec"].get("replicas", 1)
            found.append(
                Workload(name, source, template["spec"], replicas=replicas, labels=labels, namespace=namespace)
            )
    return found


def ray_workloads(rayservice: Mapping[str, Any], *, cluster_name: str | None = None) -> list[Workload]:
    """The head and worker pods KubeRay builds from the RayService (it copies each template's spec and labels).

    Labels as KubeRay v1.7.0 sets them (ray-operator/controllers/ray/common/pod.go): labelPod
    puts its own (ray.io/is-ray-node, ray.io/identifier, app.kubernetes.io/name and created-by)
    under the template's, and ray.io/cluster, ray.io/node-type and ray.io/group over them (those
    three cannot be overridden); BuildPod then sets ray.io/serve=true on every worker of a
    RayService. The head's ray.io/serve is KubeRay's rayservice controller's: true while the
    head's Serve proxy is healthy (updateHeadPodServeLabel), as it is here, a serving cluster.
    cluster_name: the RayCluster's name (KubeRay names it after the RayService with a random
    suffix, and a new one on every rebuild); default a fixed one.
    """
    cluster = rayservice["spec"]["rayClusterConfig"]
    name = rayservice["metadata"]["name"]
    namespace = rayservice["metadata"]["namespace"]
    raycluster = cluster_name or f"{name}-x7k2p"

    def labels(template: Mapping[str, Any], node_type: str, group: str) -> dict[str, str]:
        ours = dict(template.get("metadata", {}).get("labels") or {})
        defaults = {
            "ray.io/is-ray-node": "yes",
            "ray.io/identifier": f"{raycluster}-{node_type}",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
        fixed = {"ray.io/cluster": raycluster, "ray.io/node-type": node_type, "ray.io/group": group}
        return {**defaults, **ours, **fixed, "ray.io/serve": "true"}

    head = cluster["headGroupSpec"]["template"]
    head_spec = head["spec"]
    if cluster.get("enableInTreeAutoscaling"):
        # KubeRay adds the autoscaler container to the head pod, with autoscalerOptions' resources
        # (its own default when none: 500m CPU, 512Mi; common/pod.go, BuildAutoscalerContainer).
        default = {"cpu": "500m", "memory": "512Mi"}
        resources = cluster.get("autoscalerOptions", {}).get("resources") or {"requests": default, "limits": default}
        head_spec = {
            **head_spec,
            "containers": [*head_spec["containers"], {"name": "autoscaler", "resources": resources}],
        }
    found = [
        Workload(f"{name}/head", "RayService", head_spec, namespace=namespace, labels=labels(head, "head", "headgroup"))
    ]
    for group in cluster.get("workerGroupSpecs", []):
        template = group["template"]
        found.append(
            Workload(
                f"{name}/{group['groupName']}",
                "RayService",
                template["spec"],
                replicas=group["replicas"],
                namespace=namespace,
                labels=labels(template, "worker", group["groupName"]),
            )
        )
    return found


# The EKS add-ons every node group runs, with their published requests and scheduling.
def eks_addon_workloads() -> list[Workload]:
    linux_amd64 = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
                            {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate"]},
                        ]
                    }
                ]
            }
        }
    }
    everywhere = [{"operator": "Exists"}]

    def container(cpu: str | None = None, memory: str | None = None) -> dict[str, Any]:
        requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
        return {"name": "c", "resources": {"requests": requests}}

    return [
        # aws/amazon-vpc-cni-k8s charts/aws-vpc-cni values.yaml: aws-node requests cpu 25m, and its
        # network policy agent container (nodeAgent.resources) 25m; tolerates every taint.
        Workload(
            "DaemonSet/aws-node",
            "EKS add-on vpc-cni",
            {
                "affinity": linux_amd64,
                "tolerations": everywhere,
                "hostNetwork": True,
                "containers": [container("25m"), container("25m")],
            },
            daemonset=True,
            namespace="kube-system",
        ),
        # EKS's kube-proxy DaemonSet: requests cpu 100m; tolerates every taint.
        Workload(
            "DaemonSet/kube-proxy",
            "EKS add-on kube-proxy",
            {
                "affinity": linux_amd64,
                "tolerations": everywhere,
                "hostNetwork": True,
                "containers": [container("100m")],
            },
            daemonset=True,
            namespace="kube-system",
        ),
        # aws/eks-charts stable/eks-pod-identity-agent values.yaml: resources {}, tolerations [{operator: Exists}].
        Workload(
            "DaemonSet/eks-pod-identity-agent",
            "EKS add-on eks-pod-identity-agent",
            {"affinity": linux_amd64, "tolerations": everywhere, "hostNetwork": True, "containers": [container()]},
            daemonset=True,
            namespace="kube-system",
        ),
        # CoreDNS as EKS deploys it: 2 replicas, requests cpu 100m and memory 70Mi, tolerating only
        # CriticalAddonsOnly and the control-plane taint (so never a GPU node).
        Workload(
            "Deployment/coredns",
            "EKS default add-on coredns",
            {
                "affinity": linux_amd64,
                "tolerations": [
                    {"key": "CriticalAddonsOnly", "operator": "Exists"},
                    {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                ],
                "containers": [container("100m", "70Mi")],
            },
            replicas=2,
            namespace="kube-system",
            labels={"k8s-app": "kube-dns"},
        ),
    ]


# The amazon-cloudwatch-observability add-on's pods, as chart 6.4.0 renders them with the stack's
# configuration (aws-observability/helm-charts charts/amazon-cloudwatch-observability/values.yaml at
# 71a298ffdebe9d4e13ac709d24398062a2afe8ca): every component takes the root tolerations
# [{operator: Exists}] and nodeSelector kubernetes.io/os=linux; with otelContainerInsights off the
# agent runs as one DaemonSet (the cluster scraper, kube-state-metrics and node-exporter are not rendered).
# DCGM's exporter is required onto its list of GPU instance types, which holds every GPU type of
# settings.catalog; the Neuron monitor's list holds none of them.
CLOUDWATCH_ADDON = "amazon-cloudwatch-observability"
_DCGM_INSTANCE_TYPES = [
    "g6.8xlarge", "g6.12xlarge", "g6.16xlarge", "g6.2xlarge", "g6e.8xlarge", "g6e.12xlarge",
    "g5.8xlarge", "g5.12xlarge", "p4d.24xlarge", "p5.48xlarge",
]  # fmt: skip


def cloudwatch_observability_workloads(template: Mapping[str, Any]) -> list[Workload]:
    """The add-on's pods when the template installs it; none otherwise."""
    addons = [r for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Addon"]
    if not any(r["Properties"]["AddonName"] == CLOUDWATCH_ADDON for r in addons):
        return []
    everywhere = [{"operator": "Exists"}]
    linux = {"kubernetes.io/os": "linux"}
    not_fargate = {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate"]}

    def spec(cpu: str, memory: str, *, terms: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
        found: dict[str, Any] = {
            "tolerations": everywhere,
            "nodeSelector": linux,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
            **extra,
        }
        if terms is not None:
            found["affinity"] = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
            }
        return found

    source = f"EKS add-on {CLOUDWATCH_ADDON}"
    namespace = "amazon-cloudwatch"
    gpu_types = {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": _DCGM_INSTANCE_TYPES}
    return [
        Workload(
            "DaemonSet/cloudwatch-agent",
            source,
            spec("250m", "128Mi", terms=[{"matchExpressions": [not_fargate]}], hostNetwork=True),
            daemonset=True,
            namespace=namespace,
        ),
        Workload(
            "DaemonSet/fluent-bit",
            source,
            spec("50m", "25Mi", terms=[{"matchExpressions": [not_fargate]}]),
            daemonset=True,
            namespace=namespace,
        ),
        Workload(
            "DaemonSet/dcgm-exporter",
            source,
            spec("250m", "128Mi", terms=[{"matchExpressions": [gpu_types]}]),
            daemonset=True,
            namespace=namespace,
        ),
        Workload(
            "Deployment/amazon-cloudwatch-observability-controller-manager",
            source,
            spec("100m", "64Mi"),
            namespace=namespace,
        ),
    ]


# --- Predicates -----------------------------------------------------------------------
def expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels:
            return False
        have, want = int(labels[key]), int(values[0])
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {op!r}")


def required_affinity_matches(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    for term in required.get("nodeSelectorTerms", []):
        if term.get("matchFields"):
            raise ValueError("matchFields is not modelled")
        if all(expression_matches(e, labels) for e in term.get("matchExpressions", [])):
            return True
    return False


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, str]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint["effect"]:
            continue
        if not tol.get("key"):
            if tol.get("operator") == "Exists":
                return True
            continue
        if tol["key"] != taint["key"]:
            continue
        if tol.get("operator", "Equal") == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def why_not(spec: Mapping[str, Any], node: Node) -> str | None:
    """The first predicate the pod fails on this node, or None if it can land there."""
    for key, value in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} (node has {node.labels.get(key)!r})"
    if not required_affinity_matches(spec, node.labels):
        return "required node affinity matches no label set of the node"
    for taint in node.taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not tolerates(spec.get("tolerations") or [], taint):
            return f"taint {taint['key']}={taint['value']}:{taint['effect']} not tolerated"
    for resource, amount in pod_requests(spec).items():
        if amount > node.free(resource) + 1e-9:
            return f"requests {resource} {amount:g}, node has {node.free(resource):g} left"
    return None


def selects_node(spec: Mapping[str, Any], node: Node) -> bool:
    """Scheduling predicates other than resources: is this node one the pod may use at all?"""
    reason = why_not({**spec, "containers": [], "initContainers": []}, node)
    return reason is None or reason.startswith("requests pods")


# --- Placement ----------------------------------------------------------------------------
@dataclass
class Placement:
    nodes: list[Node]
    # workload name -> node names, one per placed pod
    placed: dict[str, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # (victim workload, preemptor workload, node name), in the order they happened
    preempted: list[tuple[str, str, str]] = field(default_factory=list)
    classes: dict[str, PriorityClass] = field(default_factory=dict)

    def groups_of(self, workload: str) -> set[str]:
        by_name = {n.name: n.group for n in self.nodes}
        return {by_name[n] for n in self.placed.get(workload, [])}


DEVICE_PLUGIN_RESOURCES = {
    NVIDIA_DEVICE_PLUGIN.release: lambda spec: {GPU_RESOURCE: float(spec.gpus)},
    EFA_DEVICE_PLUGIN.release: lambda spec: {EFA_RESOURCE: float(spec.efa_interfaces)},
}


def _bind(node: Node, name: str, spec: Mapping[str, Any]) -> None:
    for resource, amount in pod_requests(spec).items():
        node.used[resource] = node.used.get(resource, 0.0) + amount
    node.pods.append(name)


def _unbind(node: Node, pod: Pod) -> None:
    for resource, amount in pod_requests(pod.spec).items():
        node.used[resource] -= amount
    node.pods.remove(pod.workload)
    node.evictable.remove(pod)


def place(
    nodes: list[Node],
    workloads: Iterable[Workload],
    device_plugins: Mapping[str, str],
    classes: Mapping[str, PriorityClass] | None = None,
) -> Placement:
    """Place every workload. device_plugins maps a DaemonSet workload name to the release whose
    extended resource appears on a node only once that DaemonSet runs there; classes: the cluster's
    PriorityClasses by name (priority_classes()), Kubernetes' own when None."""
    nodes = copy.deepcopy(nodes)
    result = Placement(nodes, classes=dict(classes or priority_classes([])))
    workloads = list(workloads)
    for workload in workloads:
        if workload.daemonset:
            _place_daemonset(result, workload, device_plugins)
    place_more(result, [w for w in workloads if not w.daemonset])
    return result


def _place_daemonset(result: Placement, workload: Workload, device_plugins: Mapping[str, str]) -> None:
    result.placed[workload.name] = []
    for node in result.nodes:
        if not selects_node(workload.spec, node):
            continue
        reason = why_not(workload.spec, node)
        if reason:
            result.failures.append(f"{workload.name} ({workload.source}) on node group {node.group}: {reason}")
            continue
        _bind(node, workload.name, workload.spec)
        result.placed[workload.name].append(node.name)
        release = device_plugins.get(workload.name)
        if release:
            instance = INSTANCE_TYPES[node.labels["node.kubernetes.io/instance-type"]]
            for resource, amount in DEVICE_PLUGIN_RESOURCES[release](instance).items():
                node.allocatable[resource] = amount


def place_more(result: Placement, workloads: Iterable[Workload]) -> None:
    """Schedule these workloads' pods into an existing placement (a scale-up after the cluster came up)."""
    queue: list[Pod] = []
    for workload in workloads:
        name = workload.spec.get("priorityClassName")
        if name is not None and name not in result.classes:
            result.failures.append(f"{workload.name} ({workload.source}): no PriorityClass {name!r} in the cluster")
            continue
        cls = result.classes[name] if name is not None else PriorityClass(0)
        result.placed.setdefault(workload.name, [])
        queue += [Pod(workload.name, i, workload.spec, cls.value, cls.preempts) for i in range(workload.replicas)]
    # PrioritySort: highest priority first; sorted() keeps the arrival order within a priority.
    queue = sorted(queue, key=lambda pod: -pod.priority)
    # Preemption only ever evicts lower priorities, so it ends; a bound in case the model breaks that.
    steps = 10 * (len(queue) + 1)
    while queue:
        steps -= 1
        if steps < 0:
            raise RuntimeError(f"preemption does not settle: {[p.workload for p in queue]}")
        pod = queue.pop(0)
        candidates = [n for n in result.nodes if why_not(pod.spec, n) is None]
        if candidates:
            _bind_pod(result, max(candidates, key=lambda n: (n.free("cpu"), n.name)), pod)
            continue
        victims = _preempt(result, pod)
        if victims is None:
            reasons = "; ".join(f"node group {n.group}: {why_not(pod.spec, n)}" for n in result.nodes)
            result.failures.append(f"{pod.workload} replica {pod.replica} fits no node: {reasons}")
            continue
        # Back into the queue behind every pod of higher priority.
        queue = sorted([*queue, *victims], key=lambda p: -p.priority)


def _bind_pod(result: Placement, node: Node, pod: Pod) -> None:
    _bind(node, pod.workload, pod.spec)
    node.evictable.append(pod)
    result.placed[pod.workload].append(node.name)


def _preempt(result: Placement, pod: Pod) -> list[Pod] | None:
    """Evict the fewest pods of lower priority from one node so that this pod fits there, and bind it."""
    if not pod.preempts:
        return None
    options = []
    for node in result.nodes:
        if not selects_node(pod.spec, node):
            continue
        trial = copy.deepcopy(node)
        victims: list[Pod] = []
        for victim in sorted((p for p in node.evictable if p.priority < pod.priority), key=lambda p: p.priority):
            if why_not(pod.spec, trial) is None:
                break
            _unbind(trial, next(p for p in trial.evictable if p == victim))
            victims.append(victim)
        if victims and why_not(pod.spec, trial) is None:
            options.append((max(v.priority for v in victims), len(victims), node.name, node, victims))
    if not options:
        return None
    *_, node, victims = min(options, key=lambda option: option[:3])
    for victim in victims:
        _unbind(node, victim)
        result.placed[victim.workload].remove(node.name)
        result.preempted.append((victim.workload, pod.workload, node.name))
    _bind_pod(result, node, pod)
    return victims
