"""What each setting does and what it allows: the text of the settings reference (docs/settings.md).

Kept beside the dataclass in settings/model.py, one entry per field; `python -m settings.reference`
renders it with each field's type and default, and a test fails when a field has no entry here or
the page differs from what this would render.
"""

# ruff: noqa: E501  (each entry is the one line the page shows)

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from settings import catalog
from settings.model import ENDPOINT_ACCESS_MODES, RAY_CLUSTER_UPGRADES, SERVING_MODES, TENSOR_PARALLEL_SIZES, Settings
from settings.rules.bounds import span
from settings.sizing import (
    GPU_ROOT_MAX_GIB,
    GPU_ROOT_MIN_GIB_WITH_INSTANCE_STORE,
    GPU_ROOT_MIN_GIB_WITHOUT_INSTANCE_STORE,
    MAX_GPU_MEMORY_UTILIZATION,
    SIDES,
    decode_itl_floor_ms,
    nlb_longest_request_timeout,
    pod_efa_gbps,
    prefill_ttft_floor_ms,
)


@dataclass(frozen=True)
class SettingDoc:
    """One setting's entry: what it does, what validate() allows, and what unset (None or empty) means."""

    doc: str
    allowed: str
    unset: str = ""


def _listed(values: Iterable[object]) -> str:
    return ", ".join(f"`{v}`" for v in sorted(str(v) for v in values))


_BOOL = "true or false"
# Gbps, in bits: the KV floor alarm's threshold is in GB/s.
_DEFAULT_POD_EFA_GBPS = min(pod_efa_gbps(Settings(), side) for side in SIDES)
# The latency targets' floors on the defaults, rounded up as the rule rounds them (settings/rules/latency.py).
_PREFILL_TTFT_FLOOR_MS = math.ceil(prefill_ttft_floor_ms(Settings()))
_DECODE_ITL_FLOOR_MS = math.ceil(decode_itl_floor_ms(Settings()))

SETTING_DOCS: dict[str, SettingDoc] = {
    "region": SettingDoc(
        "pins the stack to a region (one of `settings/catalog.py` `REGION_AZS`)",
        f"one of {_listed(catalog.REGION_AZS)}",
        unset="the CLI's region",
    ),
    "account": SettingDoc(
        "pins the stack to an account; needed with `vpc_id`",
        "12 digits",
    ),
    "vpc_id": SettingDoc(
        "reuse this VPC (a context lookup: needs `account`, `region` and credentials once)",
        "`vpc-` and 8 or 17 hex digits; needs `account` and `region`",
    ),
    "vpc_cidr": SettingDoc(
        "the new VPC's range (/16 to /20)",
        "an IPv4 network from /16 to /20; only without `vpc_id`",
    ),
    "max_azs": SettingDoc(
        "AZs of the new VPC (2 or 3)",
        "2 or 3; only without `vpc_id`",
    ),
    "cluster_name": SettingDoc(
        "EKS cluster name",
        "1 to 100 letters, digits, `-` or `_`, starting with a letter or digit",
    ),
    "kubernetes_version": SettingDoc(
        "1.32 to 1.36; its kubectl layer comes from the same table",
        f"one of {_listed(catalog.KUBERNETES_VERSIONS)}",
    ),
    "endpoint_access": SettingDoc(
        "or `private`",
        f"one of {_listed(ENDPOINT_ACCESS_MODES)}",
    ),
    "public_access_cidrs": SettingDoc(
        "CIDRs (comma-separated) allowed to the public API endpoint; requests are still authenticated",
        "IPv4 networks; empty when `endpoint_access` is `private`",
        unset="0.0.0.0/0, with a warning at synth",
    ),
    "cluster_admin_arns": SettingDoc(
        "IAM role/user ARNs (comma-separated) given cluster admin by access entries",
        "IAM role or user ARNs, `arn:aws:iam::<account>:role/<name>`, never the `assumed-role` session ARN `aws sts get-caller-identity` prints (`make preflight` prints your role's)",
    ),
    "system_instance_type": SettingDoc(
        "system nodes",
        f"one of {_listed(k for k, v in catalog.INSTANCE_TYPES.items() if not v.gpus)}",
    ),
    "system_nodes_min": SettingDoc(
        "system node group size; the minimum is at least 1 (the Ray head and the operator always need a node); "
        "2 by default: a second node holds the ingress's surge replica during `make upgrade`",
        "at least 1",
    ),
    "system_nodes_desired": SettingDoc(
        "system node group size; the minimum is at least 1 (the Ray head and the operator always need a node)",
        "`system_nodes_min` to `system_nodes_max`",
    ),
    "system_nodes_max": SettingDoc(
        "system node group size; the minimum is at least 1 (the Ray head and the operator always need a node)",
        "at least `system_nodes_desired`",
    ),
    "system_volume_gib": SettingDoc(
        "system node root volume, 100 GiB or more: the Ray head runs the ~20 GB CUDA image, and an upgrade pulls a second copy",
        span("system_volume_gib"),
    ),
    "gpu_instance_type": SettingDoc(
        'a type with GPUs and EFA (`settings/catalog.py` `INSTANCE_TYPES`; see "Bigger instances"); with several GPUs per node, set the tensor-parallel sizes and replicas so that every GPU serves',
        f"one of {_listed(k for k, v in catalog.INSTANCE_TYPES.items() if v.gpus and v.efa_interfaces)}",
    ),
    "gpu_ami_release_version": SettingDoc(
        'the GPU node group\'s EKS optimized AL2023 NVIDIA AMI release (see docs/operations.md, "Moving the AMI release"); the system nodes take the newest',
        "`<kubernetes_version>.<patch>-<YYYYMMDD>`, no older than the catalog's release (its NVIDIA driver is the one the image needs)",
        "the catalog's release for `kubernetes_version` (`1.36.2-20260714` on 1.36)",
    ),
    "gpu_warm_nodes": SettingDoc(
        "spare GPU nodes kept warm for a scale-up or a lost node: each runs a placeholder pod (priority -10: below every Ray pod, and the lowest Cluster Autoscaler still adds a node for) that pulled the serving image and, for a Hugging Face model, downloaded the weights into the node's NVMe cache; a new engine replica preempts it and skips the launch, the pull and the download. Added to the GPU group's minimum and to the cost (see docs/operations.md, \"A warm node\")",
        f"{span('gpu_warm_nodes')}, at most the GPU group's maximum less its minimum (a side needs a range)",
    ),
    "gpu_availability_zone": SettingDoc(
        "the one AZ of the GPU nodes; it must offer the instance type. `make preflight PREFLIGHT_ARGS=--write-context` picks one that does and records it in `cdk.context.json`",
        "an AZ of the region",
        unset="first private subnet's AZ",
    ),
    "gpu_volume_gib": SettingDoc(
        "GPU node root volume. With instance store, nodeadm's RAID0 takes `/var/lib/kubelet`, `/var/lib/containerd`, `/var/log/pods` (and SOCI's store): images, container layers and the model cache live on the NVMe, and the root keeps the AMI's 20 GiB (OS, NVIDIA and EFA drivers) and the journal (at most 4 GiB); 30 GiB at least. Without, the root holds the image (~20 GB unpacked), a second copy during an image upgrade and the weights (16 GB for 8B BF16, twice during download); 100 GiB at least. Changing it makes a new launch template version: EKS replaces the GPU nodes one at a time (spare G quota needed, see \"Preflight\")",
        f"{GPU_ROOT_MIN_GIB_WITH_INSTANCE_STORE} (with instance store) or {GPU_ROOT_MIN_GIB_WITHOUT_INSTANCE_STORE} (without) to {GPU_ROOT_MAX_GIB}",
        unset="by type: `50` with instance store (every type in the catalog), `300` without",
    ),
    "gpu_placement_group": SettingDoc(
        "cluster placement group for the GPU nodes",
        _BOOL,
    ),
    "gpu_capacity_reservation_id": SettingDoc(
        "launch into this capacity reservation (needs `gpu_placement_group=false`)",
        "`cr-` and 17 hex digits; needs `gpu_placement_group=false`",
    ),
    "gpu_capacity_block": SettingDoc(
        "that reservation is a Capacity Block for ML: the node group's capacity type `CAPACITY_BLOCK`, the launch template's market type `capacity-block` (see \"Capacity Blocks\")",
        "true (needs `gpu_capacity_reservation_id`) or false",
    ),
    "capacity_block_end_warning_hours": SettingDoc(
        "preflight warns when the Capacity Block ends within this many hours (its end terminates the GPU nodes)",
        f"{span('capacity_block_end_warning_hours')}; only with `gpu_capacity_block`",
    ),
    "pod_imds_access": SettingDoc(
        "IMDS hop limit 2 instead of 1 (lets pods reach node credentials)",
        _BOOL,
    ),
    "model_id": SettingDoc(
        "a model in `settings/catalog.py` `MODELS`; checked to fit the GPU",
        f"one of {_listed(catalog.MODELS)}",
    ),
    "model_source": SettingDoc(
        'where the weights come from: a Hugging Face repo, or `s3://bucket/prefix` in your own account (a trailing `/`, as the S3 console copies a folder\'s URI, is dropped; the Ray pods get a Pod Identity role that reads that prefix only; see "Weights from your own S3"); `gs://` is refused',
        "a Hugging Face repo id (`owner/name`) or `s3://bucket/prefix`",
        unset="the model id",
    ),
    "max_model_len": SettingDoc(
        "context length, at most the model's own (`max_position_embeddings`, which vLLM enforces); weights + KV cache for it must fit the GPU",
        "256 to the model's context length",
    ),
    "gpu_memory_utilization": SettingDoc(
        "vLLM's share of GPU memory, up to 0.95 and at least what leaves KV for one `max_model_len` sequence after the weights and what vLLM 0.26 sets aside for the largest step (prefill's: activations of a `max_num_batched_tokens` pass or the sampler, the CUDA-graph estimate, non-torch memory; `settings/sizing/memory.py` `gpu_memory_plan`): 0.800 on the defaults. Below that vLLM refuses to start, so synth refuses it in one line",
        f"0.5 to {MAX_GPU_MEMORY_UTILIZATION}, and at least what leaves KV for one `max_model_len` sequence",
    ),
    "prefill_replicas": SettingDoc(
        'scale each side on its own: engine replicas, one Ray worker pod each (0 is refused: see "Scaling"); a side\'s nodes are its replicas × GPUs per replica ÷ GPUs per node, and a count that leaves a GPU idle is refused in one line saying what fits',
        f"{span('prefill_replicas')}, leaving no GPU of a node idle",
    ),
    "decode_replicas": SettingDoc(
        'scale each side on its own: engine replicas, one Ray worker pod each (0 is refused: see "Scaling"); a side\'s nodes are its replicas × GPUs per replica ÷ GPUs per node, and a count that leaves a GPU idle is refused in one line saying what fits',
        f"{span('decode_replicas')}, leaving no GPU of a node idle",
    ),
    "prefill_max_replicas": SettingDoc(
        "a side's maximum; above the side's `*_replicas` (then its minimum) the side autoscales: Serve adds replicas, Ray's autoscaler the worker pods (see \"Scaling\"). Below the minimum, or leaving a GPU of the last node idle, is refused in one line",
        f"{span('prefill_max_replicas')}, at least `prefill_replicas`, leaving no GPU of a node idle",
        unset="fixed",
    ),
    "decode_max_replicas": SettingDoc(
        "a side's maximum; above the side's `*_replicas` (then its minimum) the side autoscales: Serve adds replicas, Ray's autoscaler the worker pods (see \"Scaling\"). Below the minimum, or leaving a GPU of the last node idle, is refused in one line",
        f"{span('decode_max_replicas')}, at least `decode_replicas`, leaving no GPU of a node idle",
        unset="fixed",
    ),
    "prefill_target_ongoing_requests": SettingDoc(
        'the ongoing requests per replica Serve scales a side toward: required when the side has a range and no latency target, refused when it is fixed, at most the side\'s `max_ongoing_requests` (see "Scaling" for the values to start from)',
        "above 0 and at most prefill's `max_ongoing_requests`; set exactly when prefill has a range and no `prefill_ttft_target_ms`",
    ),
    "decode_target_ongoing_requests": SettingDoc(
        'the ongoing requests per replica Serve scales a side toward: required when the side has a range and no latency target, refused when it is fixed, at most the side\'s `max_ongoing_requests` (see "Scaling" for the values to start from)',
        "above 0 and at most decode's `max_ongoing_requests`; set exactly when decode has a range and no `decode_itl_target_ms`",
    ),
    "prefill_ttft_target_ms": SettingDoc(
        "a time-to-first-token target for prefill, instead of `prefill_target_ongoing_requests`: Serve scales prefill up while more than the percentile's share of its requests take longer at the prefill replica (queue plus compute), down when far fewer do. Only on a side with a range; a change applies in place, turning it on or off restarts the app's replicas (see \"Scaling\")",
        f"at least one prefill replica's time for the shortest prompt prefill is sent, `typical_request_tokens` or past `local_prefill_max_tokens` ({_PREFILL_TTFT_FLOOR_MS} ms on the defaults; `make plan` prints it) and at most `request_timeout_seconds`; only where prefill has a range, in serving_mode disaggregated, and not with `prefill_target_ongoing_requests`",
        unset="scale on ongoing requests",
    ),
    "prefill_ttft_target_percentile": SettingDoc(
        "the percentile of prefill's time to first token that `prefill_ttft_target_ms` bounds: at 90, prefill scales up while more than 10% of its requests miss the target",
        f"{span('prefill_ttft_target_percentile')}; only with `prefill_ttft_target_ms`",
    ),
    "decode_itl_target_ms": SettingDoc(
        "an inter-token-latency target for decode (a request's mean gap between streamed chunks), instead of `decode_target_ongoing_requests`: Serve scales decode up while more than the percentile's share of its requests stream slower, or its KV cache is nearly full, down when far fewer do. Only on a side with a range; a change applies in place, turning it on or off restarts the app's replicas (see \"Scaling\")",
        f"at least one decode step at decode's `max_ongoing_requests` ({_DECODE_ITL_FLOOR_MS} ms on the defaults; `make plan` prints it) and at most `request_timeout_seconds`; only where decode has a range, in serving_mode disaggregated, and not with `decode_target_ongoing_requests`",
        unset="scale on ongoing requests",
    ),
    "decode_itl_target_percentile": SettingDoc(
        "the percentile of decode's inter-token latency that `decode_itl_target_ms` bounds: at 90, decode scales up while more than 10% of its requests miss the target",
        f"{span('decode_itl_target_percentile')}; only with `decode_itl_target_ms`",
    ),
    "typical_request_tokens": SettingDoc(
        "a typical request's prompt plus output tokens: each engine replica takes as many requests at once as its KV cache holds at this length, at most vLLM's `max_num_seqs` (`settings/sizing/admission.py` `max_ongoing_requests`: 12 prefill, 13 decode on the defaults), and each caller queues as many again (64 to `max_model_len`)",
        "64 to `max_model_len`",
    ),
    "backpressure_retry_after_seconds": SettingDoc(
        "the `Retry-After` sent with the 503 a request gets past a queue bound",
        span("backpressure_retry_after_seconds"),
    ),
    "request_timeout_seconds": SettingDoc(
        "Serve's proxy ends a request, a stream included, after this long: 408 if nothing was sent yet; decode's and the ingress's drain on scale-down waits this long plus 5 s; the product's ingress ends chats and completions at it too, whatever a client's headers say, with API keys or without. Applied when Serve starts (see \"Scaling\")",
        f"{span('request_timeout_seconds')}; at most {nlb_longest_request_timeout(Settings())} with `internal_endpoint_cidrs` "
        "(the NLB's deregistration delay covers the ingress's drain)",
    ),
    "ray_worker_idle_timeout_seconds": SettingDoc(
        "with a range on some side: how long Ray's autoscaler keeps an idle worker pod (KubeRay `idleTimeoutSeconds`)",
        f"{span('ray_worker_idle_timeout_seconds')}; only with a range on some side",
    ),
    "ray_cluster_upgrade": SettingDoc(
        "how a change to the Ray cluster (image, pods, environment) rolls out: `auto`, KubeRay's blue/green `NewCluster` where the GPU group's maximum holds a second cluster at every side's minimum (the old one serves until the new one's app runs), else the recreate Job (the endpoint is down for a cluster start); `recreate`, always the Job (a capacity reservation with no room for a second cluster). See docs/operations.md, \"Upgrades\"",
        f"one of {_listed(RAY_CLUSTER_UPGRADES)}",
    ),
    "replica_surge": SettingDoc(
        'for one deploy: each engine deployment with a range (a maximum above its minimum) runs one replica more, its minimum raised by one, so that a change that restarts replicas (an engine setting such as `max_model_len`) starts the new replica before Serve stops the old one (not a new model: Serve deletes the old model\'s deployments as it starts the new); `make upgrade` deploys with it and then without, which lowers the minimum again in place. A side with no range is down for one engine start (see "Upgrades")',
        _BOOL + "; true only where some engine deployment has a range",
    ),
    "gcs_fault_tolerance": SettingDoc(
        'Ray GCS fault tolerance (KubeRay `gcsFaultToleranceOptions`): the head\'s GCS keeps its tables in an ElastiCache for Valkey store in the stack (two nodes in two AZs, TLS, encrypted at rest, an AUTH token generated into Secrets Manager and synced by External Secrets), so a lost head comes back without the cluster being rebuilt: the endpoint keeps answering and the engines are kept. Off: a lost head takes every replica with it, the endpoint down for a cluster start (see "A lost Ray head")',
        _BOOL
        + "; on, `cluster_name` is 1-36 letters, digits or single hyphens, from a letter (the store is `<cluster_name>-gcs`)",
    ),
    "gcs_store_node_type": SettingDoc(
        "the GCS store's ElastiCache node type, two of them (Ray's tables are kilobytes to a few MB)",
        f"one of {_listed(catalog.GCS_STORE_NODE_PRICES)}; only with `gcs_fault_tolerance`",
    ),
    "prefill_tensor_parallel_size": SettingDoc(
        "GPUs per engine replica on each side (vLLM `tensor_parallel_size`): a divisor of the node's GPUs, each pod holding whole EFA devices; the two may differ where vLLM 0.26's NixlConnector allows it (see \"Bigger instances\")",
        f"one of {_listed(TENSOR_PARALLEL_SIZES)} dividing the node's GPUs, each pod holding whole EFA devices",
    ),
    "decode_tensor_parallel_size": SettingDoc(
        "GPUs per engine replica on each side (vLLM `tensor_parallel_size`): a divisor of the node's GPUs, each pod holding whole EFA devices; the two may differ where vLLM 0.26's NixlConnector allows it (see \"Bigger instances\")",
        f"one of {_listed(TENSOR_PARALLEL_SIZES)} dividing the node's GPUs, each pod holding whole EFA devices; dividing or divided by `prefill_tensor_parallel_size` (equal to it when aggregated)",
    ),
    "serving_mode": SettingDoc(
        'or `aggregated`: the same GPU nodes, `prefill_replicas + decode_replicas` replicas that each prefill and decode, no KV transfer; for comparing (see "Should I disaggregate?")',
        f"one of {_listed(SERVING_MODES)}",
    ),
    "local_prefill_max_tokens": SettingDoc(
        "decode prefills a request itself when its prompt has at most this many tokens (the model's tokenizer, the chat template applied), and sends longer ones through the prefill side; a request's `x-pd-prefill: split` or `local` header overrides it. Changed in place, without restarting an engine (see \"Which requests are split\"). 0 splits every request",
        "0 to `max_model_len`; 0 or unset with `serving_mode` `aggregated`",
        unset="4,096 tokens, the public guidance below which splitting does not pay, at most `max_model_len`; 0 in `aggregated` mode",
    ),
    "prefix_cache_routing": SettingDoc(
        "Ray's prefix-cache affinity router on each engine deployment that can run more than one replica: a prompt goes to the replica that already holds its prefix (a shared system prompt, a conversation) while the replicas' queues are close (within 1 on prefill; within the full-length sequences its KV cache holds on decode), else to the less loaded one; its tree of prompts is kept within each replica's KV cache (see \"Which requests are split\"). Switching it restarts every replica of the app.",
        f"{_BOOL}; only in `disaggregated` mode",
    ),
    "ray_image": SettingDoc(
        "AWS Ray LLM DLC (Ray 2.58.0, vLLM 0.26.0, EFA). Another image must run Ray 2.58.0, the version the serve config is validated against (`IMAGE_RAY_VERSION` in `settings/catalog.py`, pinned again in `requirements-serve.lock`; a test keeps them equal), and carry the EFA installer's libfabric",
        "`registry/repository:tag` or `registry/repository@sha256:<digest>`",
    ),
    "image_pull_through_cache_prefix": SettingDoc(
        "pull `ray_image` through an ECR pull-through cache in the stack's account and region, under this repository prefix (the rule and the repository are the stack's, removed with it): a node then pulls from private ECR, which AWS measured its parallel pull against, instead of public ECR behind CloudFront (see docs/operations.md, \"A regional copy of the image\"). The prefix must be free in the account's registry",
        "2 to 30 lowercase letters, digits, and `.` `_` `-` `/` between them; needs a `ray_image` on `public.ecr.aws`",
        unset="pulled from public ECR",
    ),
    "serving_namespace": SettingDoc(
        "where the RayService lives",
        "a DNS label",
    ),
    "ray_token_auth": SettingDoc(
        'Ray token authentication on the Ray cluster (KubeRay `authOptions`): the dashboard, the job API and GCS refuse callers without the cluster\'s token (see "Who may drive the Ray cluster")',
        _BOOL,
    ),
    "service_name": SettingDoc(
        "where the RayService lives",
        "a DNS label of at most 40 characters",
    ),
    "hf_token_secret_name": SettingDoc(
        'a Secrets Manager secret holding a Hugging Face token, synced into the Kubernetes Secret `hf-token` the pods read as `HF_TOKEN`; required for gated models (see "The model token")',
        "a Secrets Manager secret name (never the token itself)",
    ),
    "hf_token_kms_key_arn": SettingDoc(
        "the customer-managed KMS key of that secret, if it has one: the External Secrets role may decrypt with it, through Secrets Manager only (preflight finds it)",
        "a KMS key ARN (not an alias) in the stack's region; only with `hf_token_secret_name`",
    ),
    "internal_endpoint_cidrs": SettingDoc(
        'CIDRs (comma-separated) allowed to an internal NLB on port 8000; empty: no load balancer (see "Private access"); without `endpoint_api_keys_secret_name`, synth warns in one line',
        "IPv4 networks narrower than 0.0.0.0/0",
    ),
    "endpoint_api_keys_secret_name": SettingDoc(
        'a Secrets Manager secret holding the endpoint\'s API keys, a JSON object `{"<key id>": "<key>", ...}`; set, every OpenAI route needs `Authorization: Bearer <key>` (see "API keys on the endpoint")',
        "a Secrets Manager secret name, not `hf_token_secret_name`'s",
    ),
    "endpoint_api_keys_kms_key_arn": SettingDoc(
        "the customer-managed KMS key of the keys' secret, if it has one: the External Secrets role may decrypt with it, through Secrets Manager only (preflight finds it; without it the Ray pods never start)",
        "a KMS key ARN (not an alias) in the stack's region; only with `endpoint_api_keys_secret_name`",
    ),
    "endpoint_api_keys_refresh_seconds": SettingDoc(
        "how often External Secrets re-reads the keys: the largest term of a rotation's delay",
        f"{span('endpoint_api_keys_refresh_seconds')}; only with `endpoint_api_keys_secret_name`",
    ),
    "endpoint_rate_limit_rpm": SettingDoc(
        "requests per minute per key, counted per ingress replica (one by default): past it, 429 with `Retry-After`; needs the keys",
        f"{span('endpoint_rate_limit_rpm')} (0: no limit); above 0 needs `endpoint_api_keys_secret_name`",
    ),
    "pd_prefill_header_keys": SettingDoc(
        "key ids (comma-separated) of `endpoint_api_keys_secret_name` whose requests may send `x-pd-prefill: split` or `local` to choose where decode prefills (for `verify` and debugging); the endpoint refuses the header from every other caller with 403 (see docs/security.md)",
        "key ids; only with `endpoint_api_keys_secret_name` in `disaggregated` mode",
    ),
    "endpoint_tls_certificate_arn": SettingDoc(
        "an ACM certificate: the internal NLB listens with TLS on 443 only (needs `internal_endpoint_cidrs`)",
        "an ACM certificate ARN of the stack's region and account; only with `internal_endpoint_cidrs`",
    ),
    "observability": SettingDoc(
        'the CloudWatch observability add-on, the managed Prometheus workspace and collector, the alarms and the dashboard (see "Watching it"); about $88 a month on the defaults, under 3% of the stack',
        _BOOL,
    ),
    "observability_scrape_interval_seconds": SettingDoc(
        "seconds between scrapes of the Ray pods (a managed collector scrapes at most every 30 s)",
        f"{span('observability_scrape_interval_seconds')}; only with `observability`",
    ),
    "alarm_email": SettingDoc(
        "an address subscribed to the alarm topic (its owner confirms the subscription by mail)",
        "one e-mail address; only with `observability`",
    ),
    "alarm_ttft_p99_seconds": SettingDoc(
        "TTFT p99 of either engine above this for 5 minutes alarms",
        "above 0 and at most 600; only with `observability`",
    ),
    "alarm_kv_throughput_floor_gb_per_s": SettingDoc(
        "KV transfers slower than this (bytes over NIXL's transfer time) for 5 minutes, while transfers happen, alarm",
        f"above 0 and at most 100, and at most one engine pod's EFA line rate ({_DEFAULT_POD_EFA_GBPS / 8:g} GB/s on {Settings().gpu_instance_type}: {_DEFAULT_POD_EFA_GBPS:g} Gbps); only with `observability` in `disaggregated` mode",
    ),
    "alarm_kv_cache_usage_ratio": SettingDoc(
        "an engine's KV cache fuller than this for 10 minutes alarms",
        "above 0 and at most 1; only with `observability`",
    ),
    "alarm_efa_flat_bytes_per_second": SettingDoc(
        'EFA "flat": the GPU nodes\' EFA receive rate below this (half of the KV-off-EFA alarm)',
        "above 0 and below `alarm_pod_network_kv_bytes_per_second` and the GPU nodes' EFA line rate; only with `observability`",
    ),
    "alarm_pod_network_kv_bytes_per_second": SettingDoc(
        "KV-sized traffic on the pod network: the serving pods' receive rate above this (the other half)",
        "above `alarm_efa_flat_bytes_per_second`, below the serving nodes' line rate on the pod network; only with `observability`",
    ),
}
