"""The cluster autoscaler settings the chart, nag and cfn-lint tests synthesize with."""

from __future__ import annotations

AUTOSCALING = {
    "prefill_max_replicas": "2",
    "decode_max_replicas": "2",
    "prefill_target_ongoing_requests": "2",
    "decode_target_ongoing_requests": "2",
}
