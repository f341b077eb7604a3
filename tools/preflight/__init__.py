"""Check the AWS account before a deploy: `python -m tools.preflight [-c key=value ...]` (`make preflight`).

Read-only calls with the caller's credentials (the actions are in iam-policy.json
beside this file), the settings `cdk synth` reads, one PASS/WARN/FAIL line per
check. `--write-context` records the checked GPU AZ and region in cdk.context.json,
with the account and zone ID it was checked in.
"""
