"""Who reaches the endpoint: the internal NLB's callers, the API keys, TLS."""

from __future__ import annotations

import re

from settings.model import Settings
from settings.rules.base import KMS_KEY_ARN, SECRET_NAME, ipv4_network, require
from settings.rules.bounds import span, within
from settings.sizing import NLB_MAX_DEREGISTRATION_DELAY_S, nlb_deregistration_delay, nlb_longest_request_timeout

_ACM_CERTIFICATE_ARN = re.compile(r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$")


def check_internal_endpoint(s: Settings) -> None:
    """The internal NLB's source CIDRs, and a request timeout its target group's drain can cover."""
    for cidr in s.internal_endpoint_cidrs:
        net = ipv4_network(cidr)
        require(
            net is not None and net.prefixlen > 0,
            "internal_endpoint_cidrs",
            cidr,
            "IPv4 networks narrower than 0.0.0.0/0, e.g. 10.0.0.0/8",
        )
    if s.internal_endpoint_cidrs:
        longest = nlb_longest_request_timeout(s)
        require(
            nlb_deregistration_delay(s) <= NLB_MAX_DEREGISTRATION_DELAY_S,
            "request_timeout_seconds",
            s.request_timeout_seconds,
            f"at most {longest} seconds with internal_endpoint_cidrs (the NLB's deregistration delay, "
            f"the ingress's drain, is at most {NLB_MAX_DEREGISTRATION_DELAY_S} s)",
        )


def check_endpoint_keys(s: Settings) -> None:
    """Who may call the endpoint: its API keys, their rate limit, and TLS on the NLB."""
    if s.endpoint_api_keys_secret_name is not None:
        require(
            bool(SECRET_NAME.match(s.endpoint_api_keys_secret_name)),
            "endpoint_api_keys_secret_name",
            s.endpoint_api_keys_secret_name,
            "a Secrets Manager secret name (the name, never a key)",
        )
        require(
            s.endpoint_api_keys_secret_name != s.hf_token_secret_name,
            "endpoint_api_keys_secret_name",
            s.endpoint_api_keys_secret_name,
            "another secret than hf_token_secret_name (the keys are a JSON object of key id to key)",
        )
    if s.endpoint_api_keys_kms_key_arn is not None:
        require(
            s.endpoint_api_keys_secret_name is not None,
            "endpoint_api_keys_kms_key_arn",
            s.endpoint_api_keys_kms_key_arn,
            "set only with endpoint_api_keys_secret_name (it is the key of that secret)",
        )
        require(
            bool(KMS_KEY_ARN.match(s.endpoint_api_keys_kms_key_arn)),
            "endpoint_api_keys_kms_key_arn",
            s.endpoint_api_keys_kms_key_arn,
            "a KMS key ARN, arn:aws:kms:<region>:<account>:key/<key id> (not an alias)",
        )
    require(
        within("endpoint_api_keys_refresh_seconds", s.endpoint_api_keys_refresh_seconds),
        "endpoint_api_keys_refresh_seconds",
        s.endpoint_api_keys_refresh_seconds,
        f"{span('endpoint_api_keys_refresh_seconds')} seconds (how often External Secrets re-reads the keys)",
    )
    require(
        within("endpoint_rate_limit_rpm", s.endpoint_rate_limit_rpm),
        "endpoint_rate_limit_rpm",
        s.endpoint_rate_limit_rpm,
        f"{span('endpoint_rate_limit_rpm')} requests per minute per key (0: no limit)",
    )
    require(
        s.endpoint_rate_limit_rpm == 0 or s.endpoint_api_keys_secret_name is not None,
        "endpoint_rate_limit_rpm",
        s.endpoint_rate_limit_rpm,
        "0 unless endpoint_api_keys_secret_name is set (the limit is counted per key)",
    )
    if s.endpoint_tls_certificate_arn is not None:
        require(
            bool(_ACM_CERTIFICATE_ARN.match(s.endpoint_tls_certificate_arn)),
            "endpoint_tls_certificate_arn",
            s.endpoint_tls_certificate_arn,
            "an ACM certificate ARN, arn:aws:acm:<region>:<account>:certificate/<id>",
        )
        require(
            bool(s.internal_endpoint_cidrs),
            "endpoint_tls_certificate_arn",
            s.endpoint_tls_certificate_arn,
            "set only with internal_endpoint_cidrs (the certificate goes on the internal NLB's listener)",
        )
