"""CASE_SETTINGS: the product's settings for a case, as a user would set them (the stack is synthesized with them).

Below both rehearsal/cases.py, which runs the cases, and the phases that synthesize a case's product
again (rehearsal/scaling.py's bound change).
"""

from __future__ import annotations

from rehearsal.keys import KEY_SETTINGS

# The cases that deploy the product in another serving mode (a setting, as a user would set it).
# The two serving cases run with API keys on the endpoint, as a user with keys deploys (and like with like
# for bench compare); the failure cases keep the defaults.
# The serving cases also size Serve's admission bounds for requests of 1,024 tokens, as a user whose
# requests are that short would (settings typical_request_tokens): the default 2,048 admits 13 at decode
# on the product's GPU, and the disconnects phase holds 20 streams at once.
# They also split every request (local_prefill_max_tokens 0, as a user who wants every prompt through prefill sets
# it): their checks, bench and faults measure the KV path with the tiny model's short prompts, which the product's
# default threshold (4,096 tokens) would prefill on decode. The pd case's selective phase sets a threshold in
# place and back; the head-loss case splits every request too (below).
SERVING_SETTINGS = {**KEY_SETTINGS, "typical_request_tokens": "1024", "local_prefill_max_tokens": "0"}
# The scaling case: a range on prefill, as a user sets it (README "Scaling": prefill aims at 1 or 2), and one on
# decode whose target the case's load never reaches (6 clients, 8 a replica): decode's room for the surge
# replica (rehearsal/surge.py), while only prefill scales with traffic. Both sides ranged run the prefix-aware
# router (ray_pods/prefix_routing.py), the product's default for a side that can run two replicas.
SCALING_SETTINGS = {
    **SERVING_SETTINGS,
    "prefill_max_replicas": "2",
    "prefill_target_ongoing_requests": "2",
    "decode_max_replicas": "2",
    "decode_target_ongoing_requests": "8",
}
# The pd case's phases that choose the prefill route with x-pd-prefill (the selective phase and its mix) send the
# key in force after the key phase's rotation: team-b (rehearsal/keys.py). Only that key may; the bad-requests
# phase adds one that may not. (verify's chat needs no header at the case's threshold of 0.)
PREFILL_HEADER_KEYS = {"pd_prefill_header_keys": "team-b"}
CASE_SETTINGS: dict[str, dict[str, str]] = {
    "pd": {**SERVING_SETTINGS, **PREFILL_HEADER_KEYS},
    "aggregated": {"serving_mode": "aggregated", **SERVING_SETTINGS},
    "scaling": SCALING_SETTINGS,
    # The product's defaults (GCS fault tolerance on), sized as the serving cases are; no keys. Both sides ranged
    # and every request split, so each request is routed twice by the prefix-aware router (ingress to decode,
    # decode to prefill), whose trees live on the head the phase kills: routing must not wait for them. Targets no
    # two-stream load reaches: the case's nodes have room for one replica a side.
    "head-loss": {
        "typical_request_tokens": "1024",
        "local_prefill_max_tokens": "0",
        "prefill_max_replicas": "2",
        "prefill_target_ongoing_requests": "8",
        "decode_max_replicas": "2",
        "decode_target_ongoing_requests": "8",
    },
}
