"""The one frozen settings object, and the one function that validates it."""

from __future__ import annotations

import importlib.util
import ipaddress
import math
import re
from dataclasses import dataclass, fields

from settings import catalog
from settings.sizing import (
    GPU_ROOT_MAX_GIB,
    MAX_GPU_MEMORY_UTILIZATION,
    gpu_memory_plan,
    gpu_root_volume_floor,
    gpu_root_volume_gib,
    max_ongoing_requests,
    min_gpu_memory_utilization,
)

ENDPOINT_ACCESS_MODES: tuple[str, ...] = ("public_and_private", "private")
# disaggregated: prefill and decode on their own GPU nodes, KV over NIXL;
# aggregated: the same GPU nodes, each replica prefills and decodes its own requests.
SERVING_MODES: tuple[str, ...] = ("disaggregated", "aggregated")


class SettingsError(ValueError):
    """A setting that cannot deploy. The message is one line that names the key."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key = key
        super().__init__(f"setting '{key}' = {value!r} is not valid: {allowed}")


@dataclass(frozen=True)
class Settings:
    """Everything a user can change, with defaults that deploy as they are.

    Override any field with ``cdk synth -c key=value`` or a YAML/JSON file named
    by ``-c settings_file=path``; see docs/settings.md.
    """

    # Where: None keeps the stack environment-agnostic (deploys to the CLI's
    # region); a GPU AZ implies its region.
    region: str | None = None
    account: str | None = None

    # Network. vpc_id reuses an existing VPC (needs account and region for the
    # lookup); otherwise a new VPC with this CIDR spans max_azs AZs.
    vpc_id: str | None = None
    vpc_cidr: str = "10.0.0.0/16"
    max_azs: int = 2

    # Cluster
    cluster_name: str = "pd-inference"
    kubernetes_version: str = catalog.DEFAULT_KUBERNETES_VERSION
    endpoint_access: str = "public_and_private"
    # Who may reach the public API endpoint (authenticated); empty: the world (a warning at synth).
    public_access_cidrs: tuple[str, ...] = ()
    cluster_admin_arns: tuple[str, ...] = ()

    # System nodes: KubeRay operator and the Ray head.
    system_instance_type: str = catalog.DEFAULT_SYSTEM_INSTANCE_TYPE
    system_nodes_min: int = 1
    system_nodes_desired: int = 2
    system_nodes_max: int = 3
    # The ~20 GB CUDA serving image (the Ray head runs it) plus a second copy
    # while an upgrade pulls the next one, plus the operators' images and logs.
    system_volume_gib: int = 100

    # GPU nodes: one per prefill or decode replica.
    gpu_instance_type: str = catalog.DEFAULT_GPU_INSTANCE_TYPE
    gpu_availability_zone: str | None = None
    # The root volume; None: the instance type's default (settings/sizing/
    # gpu_root_volume_gib), small where kubelet, containerd and the model cache
    # live on the instance store's NVMe, large where the root holds them.
    gpu_volume_gib: int | None = None
    gpu_placement_group: bool = True
    gpu_capacity_reservation_id: str | None = None
    # That reservation is a Capacity Block for ML: the node group's capacity type
    # CAPACITY_BLOCK and the launch template's market type capacity-block. The block's
    # end terminates its instances; preflight warns when it ends within the hours below.
    gpu_capacity_block: bool = False
    capacity_block_end_warning_hours: int = 24
    # Pods may reach the instance metadata service (hop limit 2) only if asked.
    pod_imds_access: bool = False
    # The GPU node group's EKS optimized AMI release ("1.36.2-20260714"); None: the one
    # settings/catalog.py pins for kubernetes_version (GPU_AMI_RELEASE_VERSIONS).
    gpu_ami_release_version: str | None = None

    # Serving
    model_id: str = catalog.DEFAULT_MODEL_ID
    model_source: str | None = None
    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.90
    prefill_replicas: int = 1
    decode_replicas: int = 1
    # Scaling (docs/operations.md, "Scaling"): each side's replicas above are its minimum, and its fixed size
    # while its maximum is None. A maximum above the minimum lets Serve add replicas while the
    # side's ongoing requests per replica stay above its target, and Ray's autoscaler add the
    # worker pods they need; a target is then required (Ray LLM's own, 1e9, never scales).
    prefill_max_replicas: int | None = None
    decode_max_replicas: int | None = None
    prefill_target_ongoing_requests: float | None = None
    decode_target_ongoing_requests: float | None = None
    # Backpressure: a typical request's prompt plus output tokens. Each engine replica takes
    # as many requests at once as its KV cache holds at this length, at most vLLM's max_num_seqs
    # (settings/sizing/admission.py max_ongoing_requests); each caller queues as many again, and past that
    # the client gets 503 with Retry-After (backpressure_retry_after_seconds).
    typical_request_tokens: int = 2048
    backpressure_retry_after_seconds: int = 10
    # Serve's proxy ends a request, a stream included, after this long (408 if nothing was sent).
    request_timeout_seconds: int = 600
    # Ray's autoscaler removes a worker pod idle this long (KubeRay idleTimeoutSeconds; used
    # only when some side has a range).
    ray_worker_idle_timeout_seconds: int = 60
    # GPUs per engine replica on each side (vLLM tensor_parallel_size); the sides may
    # differ where vLLM 0.26's NixlConnector allows it (_validate_tensor_parallel). Each
    # replica is one Ray worker pod holding its GPUs and their share of the EFA devices.
    prefill_tensor_parallel_size: int = 1
    decode_tensor_parallel_size: int = 1
    # aggregated: prefill_replicas + decode_replicas replicas that each do both,
    # on the same GPU nodes, for comparing the two (docs/architecture.md, "Should I disaggregate?").
    serving_mode: str = "disaggregated"
    ray_image: str = catalog.DEFAULT_RAY_IMAGE
    serving_namespace: str = "llm"
    # Ray's token authentication (KubeRay authOptions): the dashboard, job API
    # and GCS refuse callers without the cluster's token.
    ray_token_auth: bool = True
    service_name: str = "pd-llm"
    hf_token_secret_name: str | None = None
    # The customer-managed KMS key that encrypts that secret, if any: the
    # External Secrets role gets kms:Decrypt on it through Secrets Manager only.
    hf_token_kms_key_arn: str | None = None
    # An internal NLB for the endpoint, reachable only from these CIDRs; empty: none.
    internal_endpoint_cidrs: tuple[str, ...] = ()
    # The endpoint's API keys: a Secrets Manager secret holding a JSON object of
    # key id to key. Set, every OpenAI route needs `Authorization: Bearer <key>`.
    endpoint_api_keys_secret_name: str | None = None
    # The customer-managed KMS key that encrypts that secret, if any (its DescribeSecret KmsKeyId;
    # preflight names it): the External Secrets role gets kms:Decrypt on it through Secrets Manager
    # only. Without it External Secrets cannot read such a secret, and the Ray pods, which mount the
    # keys, never start.
    endpoint_api_keys_kms_key_arn: str | None = None
    # How often External Secrets re-reads that secret: the largest term of the
    # delay before a rotated key is accepted and a revoked one refused.
    endpoint_api_keys_refresh_seconds: int = 60
    # Requests per minute for each key, counted per ingress replica; 0: no limit.
    endpoint_rate_limit_rpm: int = 0
    # An ACM certificate for a TLS listener on 443 on the internal NLB (which then has no plain listener).
    endpoint_tls_certificate_arn: str | None = None

    # Observability (docs/operations.md, "Watching it"): the CloudWatch observability add-on, a managed
    # Prometheus workspace with its collector, rules and alert manager, and the alarms' SNS topic.
    observability: bool = True
    # Seconds between scrapes of the Ray pods (the managed collector's minimum is 30).
    observability_scrape_interval_seconds: int = 30
    # An e-mail address subscribed to the alarms' topic (confirmed by its owner); None: no subscription.
    alarm_email: str | None = None
    # Alarm thresholds, each justified in docs/operations.md, "Watching it".
    alarm_ttft_p99_seconds: float = 10.0
    alarm_kv_throughput_floor_gb_per_s: float = 1.0
    alarm_kv_cache_usage_ratio: float = 0.98
    # Container Insights reports both as bytes per second.
    alarm_efa_flat_bytes_per_second: int = 10_000
    alarm_pod_network_kv_bytes_per_second: int = 10_000_000

    def __post_init__(self) -> None:
        # The S3 console copies a folder's URI with a trailing slash; the one form every
        # reader sees (the Pod Identity policy, the serve config) has none.
        if self.model_source is not None and self.model_source.startswith("s3://"):
            object.__setattr__(self, "model_source", self.model_source.rstrip("/"))

    @property
    def gpu_nodes(self) -> int:
        """Each side's own nodes, every GPU of them serving (one per replica at tensor parallel size 1)."""
        return self.side_nodes("prefill") + self.side_nodes("decode")

    def tensor_parallel_size(self, side: str) -> int:
        return self.prefill_tensor_parallel_size if side == "prefill" else self.decode_tensor_parallel_size

    def side_replicas(self, side: str) -> int:
        return self.prefill_replicas if side == "prefill" else self.decode_replicas

    def side_max_replicas(self, side: str) -> int:
        """A side's maximum: its minimum when it has no range."""
        high = self.prefill_max_replicas if side == "prefill" else self.decode_max_replicas
        return self.side_replicas(side) if high is None else high

    def side_target_ongoing_requests(self, side: str) -> float | None:
        return self.prefill_target_ongoing_requests if side == "prefill" else self.decode_target_ongoing_requests

    def autoscales(self, side: str) -> bool:
        return self.side_max_replicas(side) > self.side_replicas(side)

    @property
    def any_autoscaling(self) -> bool:
        return self.autoscales("prefill") or self.autoscales("decode")

    def side_max_nodes(self, side: str) -> int:
        return math.ceil(self.side_max_replicas(side) / self.replicas_per_node(side))

    @property
    def gpu_nodes_max(self) -> int:
        """GPU nodes at every side's maximum (gpu_nodes while nothing autoscales)."""
        return self.side_max_nodes("prefill") + self.side_max_nodes("decode")

    def replicas_per_node(self, side: str) -> int:
        """Engine replicas (Ray worker pods) of a side on one of its nodes."""
        return max(1, self.gpu_instance.gpus // self.tensor_parallel_size(side))

    def side_nodes(self, side: str) -> int:
        return math.ceil(self.side_replicas(side) / self.replicas_per_node(side))

    @property
    def gpu_root_volume_gib(self) -> int:
        return gpu_root_volume_gib(self)

    @property
    def gpu_instance(self) -> catalog.InstanceSpec:
        return catalog.INSTANCE_TYPES[self.gpu_instance_type]

    @property
    def gpu_ami_release(self) -> str:
        """The GPU node group's releaseVersion: the setting, or the catalog's for kubernetes_version."""
        return self.gpu_ami_release_version or catalog.GPU_AMI_RELEASE_VERSIONS[self.kubernetes_version]

    @property
    def model(self) -> catalog.ModelSpec:
        return catalog.MODELS[self.model_id]

    @property
    def effective_region(self) -> str | None:
        if self.region:
            return self.region
        if self.gpu_availability_zone:
            return self.gpu_availability_zone[:-1]
        return None

    @property
    def new_vpc_availability_zones(self) -> list[str] | None:
        """A new VPC's AZs when the GPU AZ is named: it first, then the region's next ones; else None (CDK picks)."""
        az = self.gpu_availability_zone
        if az is None:
            return None
        others = [z for z in catalog.REGION_AZS[self.effective_region or ""] if z != az]
        return [az, *others[: self.max_azs - 1]]


SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Settings))


def s3_model_location(s: Settings) -> tuple[str, str] | None:
    """(bucket, prefix) of an s3:// model_source, else None."""
    if s.model_source is None or not s.model_source.startswith("s3://"):
        return None
    bucket, _, prefix = s.model_source.removeprefix("s3://").partition("/")
    return bucket, prefix.rstrip("/")


_AWS_ACCOUNT = re.compile(r"^\d{12}$")
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8}([0-9a-f]{9})?$")
_CAPACITY_RESERVATION = re.compile(r"^cr-[0-9a-f]{17}$")
_IAM_PRINCIPAL = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$")
_HF_REPO = re.compile(r"^[\w.\-]+/[\w.\-]+$")
# s3://bucket/prefix: a bucket name (3-63 lowercase letters, digits, dots, hyphens) and a non-empty prefix.
_S3_SOURCE = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]/[\w.\-/]*[\w.\-]$")
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/([0-9a-f-]{36}|mrk-[0-9a-f]{32})$")
_SECRET_NAME = re.compile(r"^[\w/+=.@-]{1,512}$")
_ACM_CERTIFICATE_ARN = re.compile(r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$")
_IMAGE = re.compile(r"^[\w.\-]+(:\d+)?(/[\w.\-]+)+(:[\w.\-]+|@sha256:[0-9a-f]{64})$")


def _ipv4_network(text: str) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(text)
    except ValueError:
        return None


def _require(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise SettingsError(key, value, allowed)


def validate(s: Settings) -> Settings:
    """Check every setting once, before any construct is made.

    Raises SettingsError naming the first bad key, its value and what is allowed.
    """
    regions = sorted(catalog.REGION_AZS)
    _require(s.region is None or s.region in catalog.REGION_AZS, "region", s.region, f"one of {regions}")
    _require(s.account is None or bool(_AWS_ACCOUNT.match(s.account)), "account", s.account, "12 digits")

    _require(s.vpc_id is None or bool(_VPC_ID.match(s.vpc_id)), "vpc_id", s.vpc_id, "vpc- and 8 or 17 hex digits")
    _require(
        s.vpc_id is None or (s.account is not None and s.effective_region is not None),
        "vpc_id",
        s.vpc_id,
        "looking up an existing VPC needs 'account' and 'region' set too",
    )
    network = _ipv4_network(s.vpc_cidr)
    _require(
        network is not None and 16 <= network.prefixlen <= 20,
        "vpc_cidr",
        s.vpc_cidr,
        "an IPv4 network from /16 to /20, e.g. 10.0.0.0/16",
    )
    _require(2 <= s.max_azs <= 3, "max_azs", s.max_azs, "2 or 3 (EKS needs two AZs)")

    _require(bool(_CLUSTER_NAME.match(s.cluster_name)), "cluster_name", s.cluster_name, "1-100 letters, digits, - or _")
    versions = list(catalog.KUBERNETES_VERSIONS)
    _require(
        s.kubernetes_version in catalog.KUBERNETES_VERSIONS,
        "kubernetes_version",
        s.kubernetes_version,
        f"a version EKS still creates clusters on: {versions}",
    )
    layer_module = catalog.KUBERNETES_VERSIONS[s.kubernetes_version]
    _require(
        importlib.util.find_spec(layer_module) is not None,
        "kubernetes_version",
        s.kubernetes_version,
        f"its kubectl layer is not installed: pip install {catalog.layer_package(s.kubernetes_version)}",
    )
    _require(
        s.endpoint_access in ENDPOINT_ACCESS_MODES,
        "endpoint_access",
        s.endpoint_access,
        f"one of {list(ENDPOINT_ACCESS_MODES)}",
    )
    for cidr in s.public_access_cidrs:
        _require(
            _ipv4_network(cidr) is not None,
            "public_access_cidrs",
            cidr,
            "IPv4 networks, e.g. 203.0.113.0/24 (your office or VPN egress)",
        )
    _require(
        not (s.public_access_cidrs and s.endpoint_access == "private"),
        "public_access_cidrs",
        list(s.public_access_cidrs),
        "empty when endpoint_access is 'private' (there is no public endpoint to restrict)",
    )
    for arn in s.cluster_admin_arns:
        _require(
            bool(_IAM_PRINCIPAL.match(arn)),
            "cluster_admin_arns",
            arn,
            "IAM role or user ARNs, arn:aws:iam::<account>:role/<name>",
        )

    system = catalog.INSTANCE_TYPES.get(s.system_instance_type)
    cpu_types = sorted(k for k, v in catalog.INSTANCE_TYPES.items() if not v.gpus)
    _require(
        system is not None and system.gpus == 0,
        "system_instance_type",
        s.system_instance_type,
        f"an instance type without a GPU (the system nodes use the standard AL2023 AMI): {cpu_types}",
    )
    _require(
        s.system_nodes_min >= 1,
        "system_nodes_min",
        s.system_nodes_min,
        "at least 1: the Ray head and the KubeRay operator must always have a node",
    )
    _require(
        s.system_nodes_min <= s.system_nodes_desired <= s.system_nodes_max,
        "system_nodes_desired",
        (s.system_nodes_min, s.system_nodes_desired, s.system_nodes_max),
        "system_nodes_min <= system_nodes_desired <= system_nodes_max",
    )
    _require(
        100 <= s.system_volume_gib <= 16384,
        "system_volume_gib",
        s.system_volume_gib,
        "100 to 16384 (the ~20 GB serving image twice during an upgrade, plus the operators)",
    )

    gpu = catalog.INSTANCE_TYPES.get(s.gpu_instance_type)
    gpu_types = sorted(k for k, v in catalog.INSTANCE_TYPES.items() if v.gpus and v.efa_interfaces)
    _require(
        gpu is not None and gpu.gpus >= 1 and gpu.efa_interfaces > 0,
        "gpu_instance_type",
        s.gpu_instance_type,
        f"an instance type with a GPU and EFA: {gpu_types}",
    )
    if s.gpu_availability_zone is not None:
        region = s.effective_region or ""
        azs = catalog.REGION_AZS.get(region, ())
        _require(
            s.gpu_availability_zone in azs,
            "gpu_availability_zone",
            s.gpu_availability_zone,
            f"an AZ of region {region!r}: {list(azs)}" if azs else f"an AZ of one of {regions}",
        )
    if s.gpu_volume_gib is not None:
        floor, holds = gpu_root_volume_floor(s)
        _require(
            floor <= s.gpu_volume_gib <= GPU_ROOT_MAX_GIB,
            "gpu_volume_gib",
            s.gpu_volume_gib,
            f"{floor} to {GPU_ROOT_MAX_GIB} on {s.gpu_instance_type} ({holds})",
        )
    if s.gpu_capacity_reservation_id is not None:
        _require(
            bool(_CAPACITY_RESERVATION.match(s.gpu_capacity_reservation_id)),
            "gpu_capacity_reservation_id",
            s.gpu_capacity_reservation_id,
            "cr- and 17 hex digits",
        )
        _require(
            not s.gpu_placement_group,
            "gpu_capacity_reservation_id",
            s.gpu_capacity_reservation_id,
            "a reservation cannot target the stack's new placement group; set gpu_placement_group=false",
        )

    _require(
        s.model_id in catalog.MODELS,
        "model_id",
        s.model_id,
        f"one of {sorted(catalog.MODELS)} (add others to settings/catalog.py)",
    )
    if s.model_source is not None:
        # gs:// needs Google credentials no pod has: it would deploy and never load.
        _require(
            bool(_HF_REPO.match(s.model_source) or _S3_SOURCE.match(s.model_source)),
            "model_source",
            s.model_source,
            "a Hugging Face repo id (owner/name) or s3://bucket/prefix (a folder holding the model's files)",
        )
    model_limit = s.model.max_context_tokens
    _require(
        256 <= s.max_model_len <= model_limit,
        "max_model_len",
        s.max_model_len,
        f"256 to {model_limit} tokens, the context length of {s.model_id} (vLLM refuses a longer one at startup)",
    )
    _require(
        0.5 <= s.gpu_memory_utilization <= MAX_GPU_MEMORY_UTILIZATION,
        "gpu_memory_utilization",
        s.gpu_memory_utilization,
        f"0.5 to {MAX_GPU_MEMORY_UTILIZATION}",
    )
    for side in ("prefill", "decode"):
        key, low = f"{side}_replicas", s.side_replicas(side)
        # Ray's autoscaler could start a side's first pod (serve_config.group_resources), but the rest
        # of the stack is built for a running replica per side.
        _require(
            1 <= low <= 16,
            key,
            low,
            "1 to 16 (the side's minimum; never 0: its ReplicasBelowMinimum alert would page through absent() "
            "whenever the side has no replica, and scaling a GPU node group up from 0 nodes is untested)",
        )
    _require(s.serving_mode in SERVING_MODES, "serving_mode", s.serving_mode, f"one of {list(SERVING_MODES)}")
    assert gpu is not None
    _validate_scaling_bounds(s)
    _validate_tensor_parallel(s)
    _validate_capacity_block(s)
    _validate_gpu_ami_release(s)
    # vLLM starts only if, after the weights and what the largest step sets aside (prefill's,
    # in disaggregated mode), one max_model_len sequence of KV fits (settings/sizing/memory.py gpu_memory_plan).
    # Per GPU of each side's tensor-parallel group: the side that needs the larger share decides.
    sizes = {side: s.tensor_parallel_size(side) for side in ("prefill", "decode")}
    least = min_gpu_memory_utilization(s, sizes)
    plans = {
        side: gpu_memory_plan(s, side, utilization=MAX_GPU_MEMORY_UTILIZATION, tensor_parallel_size=tp)
        for side, tp in sizes.items()
    }
    deciding = max(plans, key=lambda side: plans[side].before_kv + plans[side].one_sequence_kv)
    plan = plans[deciding]
    where = f"one {gpu.gpu_model}"
    if sizes[deciding] > 1:
        where += f" of a {deciding} replica's {sizes[deciding]}"
    set_aside = plan.non_torch + plan.activations + plan.cuda_graphs
    set_aside_text = f"{set_aside:.1f} GiB set aside for a {plan.step_tokens}-token step"
    _require(
        least <= MAX_GPU_MEMORY_UTILIZATION,
        "model_id",
        s.model_id,
        f"weights {plan.weights:.1f} GiB + KV cache for max_model_len={s.max_model_len} {plan.one_sequence_kv:.1f} GiB "
        f"+ {set_aside_text} must fit {plan.budget:.1f} GiB of {where} even at "
        f"gpu_memory_utilization={MAX_GPU_MEMORY_UTILIZATION}; pick a smaller model or max_model_len, or a larger GPU",
    )
    _require(
        s.gpu_memory_utilization >= least,
        "gpu_memory_utilization",
        s.gpu_memory_utilization,
        f"at least {math.ceil(least * 1000) / 1000:.3f} for {s.model_id} at max_model_len={s.max_model_len} on "
        f"{where}: weights {plan.weights:.1f} GiB + {set_aside_text} (activations {plan.activations:.2f}, "
        f"CUDA graphs {plan.cuda_graphs:.2f}, non-torch {plan.non_torch:.2f}) + KV for one max_model_len sequence "
        f"{plan.one_sequence_kv:.2f} GiB, or vLLM refuses to start",
    )
    _require(
        s.hf_token_secret_name is not None or not s.model.needs_token,
        "model_id",
        s.model_id,
        "this model is gated: set hf_token_secret_name to a Secrets Manager secret holding a Hugging Face token",
    )
    _require(bool(_IMAGE.match(s.ray_image)), "ray_image", s.ray_image, "registry/repository:tag or @sha256:digest")
    _require(bool(_K8S_NAME.match(s.serving_namespace)), "serving_namespace", s.serving_namespace, "a DNS label")
    _require(
        bool(_K8S_NAME.match(s.service_name)) and len(s.service_name) <= 40,
        "service_name",
        s.service_name,
        "a DNS label of at most 40 characters (KubeRay appends suffixes)",
    )
    if s.hf_token_secret_name is not None:
        _require(
            bool(_SECRET_NAME.match(s.hf_token_secret_name)),
            "hf_token_secret_name",
            s.hf_token_secret_name,
            "a Secrets Manager secret name (the name, never the token)",
        )
        _require(
            not s.hf_token_secret_name.startswith("hf_"),
            "hf_token_secret_name",
            "hf_***",
            "the name of a Secrets Manager secret, not the token itself",
        )
    if s.hf_token_kms_key_arn is not None:
        _require(
            s.hf_token_secret_name is not None,
            "hf_token_kms_key_arn",
            s.hf_token_kms_key_arn,
            "set only with hf_token_secret_name (it is the key of that secret)",
        )
        _require(
            bool(_KMS_KEY_ARN.match(s.hf_token_kms_key_arn)),
            "hf_token_kms_key_arn",
            s.hf_token_kms_key_arn,
            "a KMS key ARN, arn:aws:kms:<region>:<account>:key/<key id> (not an alias)",
        )
    for cidr in s.internal_endpoint_cidrs:
        net = _ipv4_network(cidr)
        _require(
            net is not None and net.prefixlen > 0,
            "internal_endpoint_cidrs",
            cidr,
            "IPv4 networks narrower than 0.0.0.0/0, e.g. 10.0.0.0/8",
        )
    _validate_endpoint_keys(s)
    _validate_observability(s)
    _validate_backpressure(s)
    return s


def _validate_scaling_bounds(s: Settings) -> None:
    """Each side's minimum, maximum and target: a fixed size, or a range with a target."""
    for side in ("prefill", "decode"):
        low, high = s.side_replicas(side), s.prefill_max_replicas if side == "prefill" else s.decode_max_replicas
        key = f"{side}_max_replicas"
        if high is not None:
            _require(1 <= high <= 16, key, high, f"1 to 16, at least {side}_replicas (None: fixed at {side}_replicas)")
            _require(high >= low, key, high, f"at least {side}_replicas = {low} (the side's minimum)")
        target = s.side_target_ongoing_requests(side)
        target_key = f"{side}_target_ongoing_requests"
        _require(
            target is None or s.autoscales(side),
            target_key,
            target,
            f"unset while {side}_max_replicas is unset or equal to {side}_replicas: a fixed size scales toward nothing",
        )
        _require(
            target is not None or not s.autoscales(side),
            target_key,
            target,
            f"set when {side}_max_replicas > {side}_replicas: the ongoing requests per replica Serve scales toward "
            '(Ray LLM\'s default, 1e9, never scales; docs/operations.md, "Scaling")',
        )


def _validate_backpressure(s: Settings) -> None:
    """The admission bounds (settings/sizing/), the targets within them, the timeout and the idle timeout."""
    _require(
        64 <= s.typical_request_tokens <= s.max_model_len,
        "typical_request_tokens",
        s.typical_request_tokens,
        f"64 to max_model_len = {s.max_model_len} (a typical request's prompt plus output tokens)",
    )
    for side in ("prefill", "decode"):
        target = s.side_target_ongoing_requests(side)
        if target is None:
            continue
        bound = max_ongoing_requests(s, side)
        _require(
            0 < target <= bound,
            f"{side}_target_ongoing_requests",
            target,
            f"above 0 and at most {bound}, the requests one {side} replica takes at once (max_ongoing_requests: "
            f"its KV cache at typical_request_tokens = {s.typical_request_tokens}); a larger target scales only "
            "once requests queue",
        )
    _require(
        1 <= s.backpressure_retry_after_seconds <= 3600,
        "backpressure_retry_after_seconds",
        s.backpressure_retry_after_seconds,
        "1 to 3600 seconds (the Retry-After sent with a 503 past the queue bounds)",
    )
    _require(
        30 <= s.request_timeout_seconds <= 86400,
        "request_timeout_seconds",
        s.request_timeout_seconds,
        "30 to 86400 seconds (the longest a request, a whole stream included, may take)",
    )
    _require(
        10 <= s.ray_worker_idle_timeout_seconds <= 86400,
        "ray_worker_idle_timeout_seconds",
        s.ray_worker_idle_timeout_seconds,
        "10 to 86400 seconds (how long an idle Ray worker pod is kept before Ray's autoscaler removes it)",
    )


def _validate_gpu_ami_release(s: Settings) -> None:
    """An EKS optimized AMI release of the cluster's own minor version (EKS creates a node group on no other)."""
    pattern = re.escape(s.kubernetes_version) + r"\.\d+-\d{8}"
    _require(
        s.gpu_ami_release_version is None or re.fullmatch(pattern, s.gpu_ami_release_version) is not None,
        "gpu_ami_release_version",
        s.gpu_ami_release_version,
        f"an EKS optimized AL2023 NVIDIA AMI release for Kubernetes {s.kubernetes_version}: "
        f"{s.kubernetes_version}.<patch>-<YYYYMMDD>, e.g. {catalog.GPU_AMI_RELEASE_VERSIONS[s.kubernetes_version]}",
    )


def _validate_capacity_block(s: Settings) -> None:
    """A Capacity Block for ML is a capacity reservation launched with market type capacity-block."""
    _require(
        not s.gpu_capacity_block or s.gpu_capacity_reservation_id is not None,
        "gpu_capacity_block",
        s.gpu_capacity_block,
        "set with gpu_capacity_reservation_id (the Capacity Block's reservation id, cr-...)",
    )
    _require(
        0 <= s.capacity_block_end_warning_hours <= 24 * 182,
        "capacity_block_end_warning_hours",
        s.capacity_block_end_warning_hours,
        "0 to 4368 hours (a Capacity Block lasts at most 182 days)",
    )


# Tensor-parallel sizes a node's GPUs split into.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)


def _validate_tensor_parallel(s: Settings) -> None:
    """Every GPU of every GPU node serves, every pod holds whole EFA devices, and vLLM 0.26's
    NixlConnector accepts the pair (the rules read from its source, cited at each check)."""
    gpu = s.gpu_instance
    for side in ("prefill", "decode"):
        key, tp = f"{side}_tensor_parallel_size", s.tensor_parallel_size(side)
        fits = [t for t in TENSOR_PARALLEL_SIZES if t <= gpu.gpus and gpu.gpus % t == 0]
        _require(tp in fits, key, tp, f"one of {fits}: a divisor of {s.gpu_instance_type}'s {gpu.gpus} GPUs")
        pods = gpu.gpus // tp
        # The EFA device plugin gives each device to one pod (EKS user guide, device-management-efa).
        whole = [t for t in fits if gpu.efa_interfaces % (gpu.gpus // t) == 0]
        _require(
            gpu.efa_interfaces % pods == 0,
            key,
            tp,
            f"{s.gpu_instance_type} has {gpu.efa_interfaces} EFA device(s) for {gpu.gpus} GPUs: {pods} pods per node "
            f"cannot each hold whole EFA devices; use one of {whole}",
        )
        replicas = s.side_replicas(side)
        idle = (-replicas) % pods * tp
        other_sizes = [t for t in whole if (replicas * t) % gpu.gpus == 0]
        _require(
            idle == 0,
            f"{side}_replicas",
            replicas,
            f"{replicas} replica(s) of {tp} GPU(s) leave {idle} of {s.gpu_instance_type}'s {gpu.gpus} GPUs idle on a "
            f"{side} node; fits: {side}_replicas={replicas + (-replicas) % pods}"
            + (f", or {side}_tensor_parallel_size={other_sizes[0]}" if other_sizes else ""),
        )
        # The GPU group grows by whole nodes: at the maximum every node it added must be full too.
        high = s.side_max_replicas(side)
        spare = (-high) % pods * tp
        _require(
            spare == 0,
            f"{side}_max_replicas",
            high,
            f"{high} replica(s) of {tp} GPU(s) need {s.side_max_nodes(side)} {s.gpu_instance_type} node(s) and leave "
            f"{spare} of a node's {gpu.gpus} GPUs idle at the maximum; "
            f"fits: {side}_max_replicas={high + (-high) % pods}",
        )
    p, d = s.prefill_tensor_parallel_size, s.decode_tensor_parallel_size
    if s.serving_mode == "aggregated":
        _require(p == d, "decode_tensor_parallel_size", d, f"equal to prefill_tensor_parallel_size {p} when aggregated")
        return
    # vllm/distributed/kv_transfer/kv_connector/utils.py, TransferTopology.tp_ratio: asserts divisibility.
    _require(
        max(p, d) % min(p, d) == 0,
        "decode_tensor_parallel_size",
        d,
        f"a size that divides or is divided by prefill_tensor_parallel_size {p} (vLLM NixlConnector tp_ratio)",
    )
    # nixl/base_worker.py, _validate_remote_agent_handshake: with prefill TP > decode TP, a
    # prefill that replicates KV heads (TP > num_key_value_heads) is refused at the handshake.
    heads = s.model.kv_heads
    _require(
        not (p > d and p > heads),
        "prefill_tensor_parallel_size",
        p,
        f"at most {heads} (the KV heads of {s.model_id}) when larger than decode_tensor_parallel_size {d} "
        "(vLLM NixlConnector refuses replicated KV heads from a larger prefill TP)",
    )


def _validate_endpoint_keys(s: Settings) -> None:
    """Who may call the endpoint: its API keys, their rate limit, and TLS on the NLB."""
    if s.endpoint_api_keys_secret_name is not None:
        _require(
            bool(_SECRET_NAME.match(s.endpoint_api_keys_secret_name)),
            "endpoint_api_keys_secret_name",
            s.endpoint_api_keys_secret_name,
            "a Secrets Manager secret name (the name, never a key)",
        )
        _require(
            s.endpoint_api_keys_secret_name != s.hf_token_secret_name,
            "endpoint_api_keys_secret_name",
            s.endpoint_api_keys_secret_name,
            "another secret than hf_token_secret_name (the keys are a JSON object of key id to key)",
        )
    if s.endpoint_api_keys_kms_key_arn is not None:
        _require(
            s.endpoint_api_keys_secret_name is not None,
            "endpoint_api_keys_kms_key_arn",
            s.endpoint_api_keys_kms_key_arn,
            "set only with endpoint_api_keys_secret_name (it is the key of that secret)",
        )
        _require(
            bool(_KMS_KEY_ARN.match(s.endpoint_api_keys_kms_key_arn)),
            "endpoint_api_keys_kms_key_arn",
            s.endpoint_api_keys_kms_key_arn,
            "a KMS key ARN, arn:aws:kms:<region>:<account>:key/<key id> (not an alias)",
        )
    _require(
        15 <= s.endpoint_api_keys_refresh_seconds <= 86400,
        "endpoint_api_keys_refresh_seconds",
        s.endpoint_api_keys_refresh_seconds,
        "15 to 86400 seconds (how often External Secrets re-reads the keys)",
    )
    _require(
        0 <= s.endpoint_rate_limit_rpm <= 1_000_000,
        "endpoint_rate_limit_rpm",
        s.endpoint_rate_limit_rpm,
        "0 (no limit) to 1000000 requests per minute per key",
    )
    _require(
        s.endpoint_rate_limit_rpm == 0 or s.endpoint_api_keys_secret_name is not None,
        "endpoint_rate_limit_rpm",
        s.endpoint_rate_limit_rpm,
        "0 unless endpoint_api_keys_secret_name is set (the limit is counted per key)",
    )
    if s.endpoint_tls_certificate_arn is not None:
        _require(
            bool(_ACM_CERTIFICATE_ARN.match(s.endpoint_tls_certificate_arn)),
            "endpoint_tls_certificate_arn",
            s.endpoint_tls_certificate_arn,
            "an ACM certificate ARN, arn:aws:acm:<region>:<account>:certificate/<id>",
        )
        _require(
            bool(s.internal_endpoint_cidrs),
            "endpoint_tls_certificate_arn",
            s.endpoint_tls_certificate_arn,
            "set only with internal_endpoint_cidrs (the certificate goes on the internal NLB's listener)",
        )


_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _validate_observability(s: Settings) -> None:
    """The collector's interval and the alarm thresholds."""
    _require(
        30 <= s.observability_scrape_interval_seconds <= 300,
        "observability_scrape_interval_seconds",
        s.observability_scrape_interval_seconds,
        "30 to 300 seconds (a managed collector scrapes at most every 30 s)",
    )
    if s.alarm_email is not None:
        _require(bool(_EMAIL.match(s.alarm_email)), "alarm_email", s.alarm_email, "one e-mail address, name@domain")
    _require(
        0 < s.alarm_ttft_p99_seconds <= 600, "alarm_ttft_p99_seconds", s.alarm_ttft_p99_seconds, "0 to 600 seconds"
    )
    _require(
        0 < s.alarm_kv_throughput_floor_gb_per_s <= 100,
        "alarm_kv_throughput_floor_gb_per_s",
        s.alarm_kv_throughput_floor_gb_per_s,
        "above 0 and at most 100 GB/s",
    )
    _require(
        0 < s.alarm_kv_cache_usage_ratio <= 1,
        "alarm_kv_cache_usage_ratio",
        s.alarm_kv_cache_usage_ratio,
        "above 0 and at most 1 (vLLM's kv_cache_usage_perc is a ratio)",
    )
    _require(
        0 < s.alarm_efa_flat_bytes_per_second < s.alarm_pod_network_kv_bytes_per_second,
        "alarm_efa_flat_bytes_per_second",
        s.alarm_efa_flat_bytes_per_second,
        "above 0 and below alarm_pod_network_kv_bytes_per_second (EFA flat while KV-sized traffic is on pod network)",
    )
