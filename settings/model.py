"""The one frozen settings object: every setting, its type and default (the rules are in settings/rules/)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from settings import catalog
from settings.sizing import gpu_root_volume_gib

ENDPOINT_ACCESS_MODES: tuple[str, ...] = ("public_and_private", "private")
# disaggregated: prefill and decode on their own GPU nodes, KV over NIXL;
# aggregated: the same GPU nodes, each replica prefills and decodes its own requests.
SERVING_MODES: tuple[str, ...] = ("disaggregated", "aggregated")
RAY_CLUSTER_UPGRADES: tuple[str, ...] = ("auto", "recreate")


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
    system_nodes_min: int = 2
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
    # Spare GPU nodes kept warm within the GPU group's maximum (docs/operations.md, "A warm node"):
    # each holds a placeholder pod that pulled the serving image and, for a Hugging Face model,
    # filled the node's model cache; a new engine replica preempts it. Paid for like any GPU node.
    gpu_warm_nodes: int = 0

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
    # Or, on a side with a range, a latency target instead of the ongoing-requests one (docs/operations.md,
    # "Scaling"): prefill scales so that this percentile of its requests' time at the prefill replica (queue and
    # compute: its share of the time to first token) stays under the target, decode so that this percentile of its
    # requests' inter-token latency does. None: the ongoing-requests target.
    prefill_ttft_target_ms: int | None = None
    prefill_ttft_target_percentile: int = 90
    decode_itl_target_ms: int | None = None
    decode_itl_target_percentile: int = 90
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
    # A change to the Ray cluster (image, pods, environment) (docs/operations.md, "Upgrades"). auto: KubeRay's
    # blue/green NewCluster where the GPU group's maximum holds a second cluster at its minimum, else the
    # recreate Job (the endpoint is down for a cluster start); recreate: always the Job (a capacity
    # reservation with no room for a second cluster, say).
    ray_cluster_upgrade: str = "auto"
    # For one deploy (docs/operations.md, "Upgrades"): each engine deployment with a range runs one replica more,
    # so that a change that restarts replicas keeps one serving; `make upgrade` deploys with it, then without.
    replica_surge: bool = False
    # GCS fault tolerance (docs/operations.md, "A lost Ray head"): the head's GCS keeps its tables in an
    # ElastiCache for Valkey store (two nodes, Multi-AZ, TLS, an AUTH token from Secrets Manager), so a head
    # that restarts finds them and the workers and replicas stay. False: a lost head takes every replica.
    gcs_fault_tolerance: bool = True
    gcs_store_node_type: str = catalog.DEFAULT_GCS_STORE_NODE_TYPE
    # GPUs per engine replica on each side (vLLM tensor_parallel_size); the sides may
    # differ where vLLM 0.26's NixlConnector allows it (_validate_tensor_parallel). Each
    # replica is one Ray worker pod holding its GPUs and their share of the EFA devices.
    prefill_tensor_parallel_size: int = 1
    decode_tensor_parallel_size: int = 1
    # aggregated: prefill_replicas + decode_replicas replicas that each do both,
    # on the same GPU nodes, for comparing the two (docs/architecture.md, "Should I disaggregate?").
    serving_mode: str = "disaggregated"
    # Decode prefills a request itself when its prompt, counted by the model's tokenizer with the chat template,
    # has at most this many tokens; longer prompts go through the prefill side (docs/architecture.md, "Which
    # requests are split"). 0: every request is split. Changed in place: no engine restarts. None: 4,096, the public
    # guidance below which splitting does not pay (settings/sizing/transfer.py, local_prefill_threshold).
    local_prefill_max_tokens: int | None = None
    # Prefix-aware routing (ray_pods/prefix_routing.py) on each engine deployment that can run more than one
    # replica: a prompt goes to the replica that already holds its prefix while the replicas' loads are close.
    # Switching it restarts every replica of the app (Serve hashes each deployment's router into the code version).
    prefix_cache_routing: bool = True
    ray_image: str = catalog.DEFAULT_RAY_IMAGE
    # Pull ray_image (on public ECR) through an ECR pull-through cache rule with this repository prefix,
    # in the stack's account and region (docs/operations.md, "A regional copy of the image"); None: from
    # public ECR. The prefix must be free in the account's registry: the rule is registry-wide.
    image_pull_through_cache_prefix: str | None = None
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
    # The key ids (of that secret) whose requests may send `x-pd-prefill` to choose decode's prefill route;
    # the ingress refuses the header from every other caller (docs/security.md). Empty: nobody.
    pd_prefill_header_keys: tuple[str, ...] = ()
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

    def side_latency_target(self, side: str) -> tuple[int, int] | None:
        """A side's latency target as (milliseconds, percentile), or None when it scales on ongoing requests."""
        if side == "prefill":
            ms, percentile = self.prefill_ttft_target_ms, self.prefill_ttft_target_percentile
        else:
            ms, percentile = self.decode_itl_target_ms, self.decode_itl_target_percentile
        return None if ms is None else (ms, percentile)

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


# Tensor-parallel sizes vLLM's engine is run with here (its group must divide a node's GPUs).
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
