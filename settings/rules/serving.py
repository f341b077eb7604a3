"""What serves: the model, its memory on the GPU, the replicas and their bounds, the image and names."""

from __future__ import annotations

import math
import re

from settings import catalog
from settings.model import RAY_CLUSTER_UPGRADES, SERVING_MODES, Settings
from settings.rules.base import KMS_KEY_ARN, SECRET_NAME, require
from settings.rules.bounds import span, within
from settings.rules.latency import LATENCY_KEYS
from settings.sizing import (
    MAX_GPU_MEMORY_UTILIZATION,
    engine_sides,
    gpu_memory_plan,
    max_ongoing_requests,
    min_gpu_memory_utilization,
    surge_room,
)

_GCS_STORE_CLUSTER_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9-]{0,34}[A-Za-z0-9])?$")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HF_REPO = re.compile(r"^[\w.\-]+/[\w.\-]+$")
# s3://bucket/prefix: a bucket name (3-63 lowercase letters, digits, dots, hyphens) and a non-empty prefix.
_S3_SOURCE = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]/[\w.\-/]*[\w.\-]$")
_IMAGE = re.compile(r"^[\w.\-]+(:\d+)?(/[\w.\-]+)+(:[\w.\-]+|@sha256:[0-9a-f]{64})$")

_ECR_PREFIX = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$")


def check_model(s: Settings) -> None:
    """The model, its source and context, vLLM's memory share, each side's minimum, the mode."""
    require(
        s.model_id in catalog.MODELS,
        "model_id",
        s.model_id,
        f"one of {sorted(catalog.MODELS)} (add others to settings/catalog.py)",
    )
    if s.model_source is not None:
        # gs:// needs Google credentials no pod has: it would deploy and never load.
        require(
            bool(_HF_REPO.match(s.model_source) or _S3_SOURCE.match(s.model_source)),
            "model_source",
            s.model_source,
            "a Hugging Face repo id (owner/name) or s3://bucket/prefix (a folder holding the model's files)",
        )
    model_limit = s.model.max_context_tokens
    require(
        256 <= s.max_model_len <= model_limit,
        "max_model_len",
        s.max_model_len,
        f"256 to {model_limit} tokens, the context length of {s.model_id} (vLLM refuses a longer one at startup)",
    )
    require(
        0.5 <= s.gpu_memory_utilization <= MAX_GPU_MEMORY_UTILIZATION,
        "gpu_memory_utilization",
        s.gpu_memory_utilization,
        f"0.5 to {MAX_GPU_MEMORY_UTILIZATION}",
    )
    for side in ("prefill", "decode"):
        key, low = f"{side}_replicas", s.side_replicas(side)
        # Ray's autoscaler could start a side's first pod (serve_config.pod_templates.group_resources), but the rest
        # of the stack is built for a running replica per side.
        require(
            within(key, low),
            key,
            low,
            f"{span(key)} (the side's minimum; never 0: its ReplicasBelowMinimum alert would page through absent() "
            "whenever the side has no replica, and scaling a GPU node group up from 0 nodes is untested)",
        )
    require(s.serving_mode in SERVING_MODES, "serving_mode", s.serving_mode, f"one of {list(SERVING_MODES)}")
    if s.local_prefill_max_tokens is not None:
        require(
            0 <= s.local_prefill_max_tokens <= s.max_model_len,
            "local_prefill_max_tokens",
            s.local_prefill_max_tokens,
            f"0 (split every request) to max_model_len = {s.max_model_len} tokens",
        )
        require(
            s.serving_mode != "aggregated" or s.local_prefill_max_tokens == 0,
            "local_prefill_max_tokens",
            s.local_prefill_max_tokens,
            "0 or unset with serving_mode aggregated (every replica prefills its own requests there)",
        )
    require(
        s.ray_cluster_upgrade in RAY_CLUSTER_UPGRADES,
        "ray_cluster_upgrade",
        s.ray_cluster_upgrade,
        f"one of {list(RAY_CLUSTER_UPGRADES)}",
    )
    if s.replica_surge:
        require(
            any(surge_room(s, side) for side in engine_sides(s)),
            "replica_surge",
            s.replica_surge,
            "true only where an engine deployment has room for one replica more: "
            + (
                "prefill_max_replicas or decode_max_replicas above its minimum"
                if s.serving_mode != "aggregated"
                else "a maximum above prefill_replicas + decode_replicas"
            ),
        )
    stores = list(catalog.GCS_STORE_NODE_PRICES)
    require(s.gcs_store_node_type in stores, "gcs_store_node_type", s.gcs_store_node_type, f"one of {stores}")
    if s.gcs_fault_tolerance:
        # The store's replication group is `<cluster_name>-gcs`: ElastiCache's 1-40 letters, digits or
        # hyphens, from a letter, with no two hyphens in a row and none at the end.
        require(
            bool(_GCS_STORE_CLUSTER_NAME.match(s.cluster_name)) and "--" not in s.cluster_name,
            "cluster_name",
            s.cluster_name,
            "with gcs_fault_tolerance (the store is named <cluster_name>-gcs): 1-36 letters, digits or single "
            "hyphens, from a letter, not ending in a hyphen",
        )


def check_memory_fit(s: Settings) -> None:
    """The model fits the GPU at the share asked for."""
    gpu = s.gpu_instance
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
    require(
        least <= MAX_GPU_MEMORY_UTILIZATION,
        "model_id",
        s.model_id,
        f"weights {plan.weights:.1f} GiB + KV cache for max_model_len={s.max_model_len} {plan.one_sequence_kv:.1f} GiB "
        f"+ {set_aside_text} must fit {plan.budget:.1f} GiB of {where} even at "
        f"gpu_memory_utilization={MAX_GPU_MEMORY_UTILIZATION}; pick a smaller model or max_model_len, or a larger GPU",
    )
    require(
        s.gpu_memory_utilization >= least,
        "gpu_memory_utilization",
        s.gpu_memory_utilization,
        f"at least {math.ceil(least * 1000) / 1000:.3f} for {s.model_id} at max_model_len={s.max_model_len} on "
        f"{where}: weights {plan.weights:.1f} GiB + {set_aside_text} (activations {plan.activations:.2f}, "
        f"CUDA graphs {plan.cuda_graphs:.2f}, non-torch {plan.non_torch:.2f}) + KV for one max_model_len sequence "
        f"{plan.one_sequence_kv:.2f} GiB, or vLLM refuses to start",
    )
    require(
        s.hf_token_secret_name is not None or not s.model.needs_token,
        "model_id",
        s.model_id,
        "this model is gated: set hf_token_secret_name to a Secrets Manager secret holding a Hugging Face token",
    )


def check_names_and_secrets(s: Settings) -> None:
    """The image, the Kubernetes names and the model token's secret and key."""
    require(bool(_IMAGE.match(s.ray_image)), "ray_image", s.ray_image, "registry/repository:tag or @sha256:digest")
    prefix = s.image_pull_through_cache_prefix
    if prefix is not None:
        # AWS::ECR::PullThroughCacheRule EcrRepositoryPrefix, as its CloudFormation schema allows it.
        require(
            2 <= len(prefix) <= 30 and bool(_ECR_PREFIX.match(prefix)),
            "image_pull_through_cache_prefix",
            prefix,
            "2 to 30 lowercase letters, digits, and . _ - / between them (an ECR repository prefix)",
        )
        require(
            s.ray_image.startswith(catalog.ECR_PUBLIC_REGISTRY + "/"),
            "image_pull_through_cache_prefix",
            prefix,
            f"set only with a ray_image on {catalog.ECR_PUBLIC_REGISTRY} (the rule's upstream), not {s.ray_image}",
        )
    require(bool(_K8S_NAME.match(s.serving_namespace)), "serving_namespace", s.serving_namespace, "a DNS label")
    require(
        bool(_K8S_NAME.match(s.service_name)) and len(s.service_name) <= 40,
        "service_name",
        s.service_name,
        "a DNS label of at most 40 characters (KubeRay appends suffixes)",
    )
    if s.hf_token_secret_name is not None:
        require(
            bool(SECRET_NAME.match(s.hf_token_secret_name)),
            "hf_token_secret_name",
            s.hf_token_secret_name,
            "a Secrets Manager secret name (the name, never the token)",
        )
        require(
            not s.hf_token_secret_name.startswith("hf_"),
            "hf_token_secret_name",
            "hf_***",
            "the name of a Secrets Manager secret, not the token itself",
        )
    if s.hf_token_kms_key_arn is not None:
        require(
            s.hf_token_secret_name is not None,
            "hf_token_kms_key_arn",
            s.hf_token_kms_key_arn,
            "set only with hf_token_secret_name (it is the key of that secret)",
        )
        require(
            bool(KMS_KEY_ARN.match(s.hf_token_kms_key_arn)),
            "hf_token_kms_key_arn",
            s.hf_token_kms_key_arn,
            "a KMS key ARN, arn:aws:kms:<region>:<account>:key/<key id> (not an alias)",
        )


def check_scaling_bounds(s: Settings) -> None:
    """Each side's minimum, maximum and target: a fixed size, or a range with a target."""
    for side in ("prefill", "decode"):
        low, high = s.side_replicas(side), s.prefill_max_replicas if side == "prefill" else s.decode_max_replicas
        key = f"{side}_max_replicas"
        if high is not None:
            require(
                within(key, high), key, high, f"{span(key)}, at least {side}_replicas (None: fixed at {side}_replicas)"
            )
            require(high >= low, key, high, f"at least {side}_replicas = {low} (the side's minimum)")
        target = s.side_target_ongoing_requests(side)
        target_key = f"{side}_target_ongoing_requests"
        require(
            target is None or s.autoscales(side),
            target_key,
            target,
            f"unset while {side}_max_replicas is unset or equal to {side}_replicas: a fixed size scales toward nothing",
        )
        # A latency target (settings/rules/latency.py) is the other thing a range may scale toward.
        require(
            target is not None or not s.autoscales(side) or s.side_latency_target(side) is not None,
            target_key,
            target,
            f"set when {side}_max_replicas > {side}_replicas: the ongoing requests per replica Serve scales toward "
            f"(or set {LATENCY_KEYS[side][0]} instead; Ray LLM's default, 1e9, never scales; docs/operations.md, "
            '"Scaling")',
        )


def check_backpressure(s: Settings) -> None:
    """The admission bounds (settings/sizing/), the targets within them, the timeout and the idle timeout."""
    require(
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
        require(
            0 < target <= bound,
            f"{side}_target_ongoing_requests",
            target,
            f"above 0 and at most {bound}, the requests one {side} replica takes at once (max_ongoing_requests: "
            f"its KV cache at typical_request_tokens = {s.typical_request_tokens}); a larger target scales only "
            "once requests queue",
        )
    require(
        within("backpressure_retry_after_seconds", s.backpressure_retry_after_seconds),
        "backpressure_retry_after_seconds",
        s.backpressure_retry_after_seconds,
        f"{span('backpressure_retry_after_seconds')} seconds (the Retry-After sent with a 503 past the queue bounds)",
    )
    require(
        within("request_timeout_seconds", s.request_timeout_seconds),
        "request_timeout_seconds",
        s.request_timeout_seconds,
        f"{span('request_timeout_seconds')} seconds (the longest a request, a whole stream included, may take)",
    )
    require(
        within("ray_worker_idle_timeout_seconds", s.ray_worker_idle_timeout_seconds),
        "ray_worker_idle_timeout_seconds",
        s.ray_worker_idle_timeout_seconds,
        f"{span('ray_worker_idle_timeout_seconds')} seconds "
        "(how long an idle Ray worker pod is kept before Ray's autoscaler removes it)",
    )


def check_prefill_header_keys(s: Settings) -> None:
    """pd_prefill_header_keys: key ids, only where there are keys and a prefill route to choose."""
    if not s.pd_prefill_header_keys:
        return
    require(
        s.endpoint_api_keys_secret_name is not None and s.serving_mode != "aggregated",
        "pd_prefill_header_keys",
        ",".join(s.pd_prefill_header_keys),
        "empty unless endpoint_api_keys_secret_name is set and serving_mode is disaggregated (the header is "
        "allowed per key id, and only decode's prefill route reads it)",
    )
