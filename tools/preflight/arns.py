"""The settings' ARNs against the region and account preflight found.

Where the settings name the region and account, validation already refused an ARN of another
(settings/rules/arns.py); without them the stack goes wherever the CLI points, known only here.
"""

from __future__ import annotations

from settings.rules.arns import REGIONAL_ARNS, arn_mismatch, arn_region_account
from tools.preflight.base import Account, Result

CHECK = "setting ARNs"


def setting_arns(account: Account) -> list[Result]:
    """One FAIL per ARN of another region (or, for a certificate, account); a PASS when all match; none unset."""
    settings, results, named = account.settings, [], []
    for entry in REGIONAL_ARNS:
        arn = getattr(settings, entry.setting)
        if arn is None:
            continue
        named.append(entry.setting)
        wrong = arn_mismatch(entry, arn, account.region, account.account_id)
        if wrong is None:
            continue
        arn_region, _ = arn_region_account(arn)
        if arn_region != account.region:
            fix = f"-c {entry.setting}=<a {entry.service} in {account.region}>, or -c region={arn_region}"
        else:
            fix = f"-c {entry.setting}=<a {entry.service} of account {account.account_id}>"
        results.append(Result("FAIL", CHECK, f"{entry.setting} is {arn}: it must be {wrong}", fix))
    if named and not results:
        results.append(Result("PASS", CHECK, f"{', '.join(named)} in {account.region}, account {account.account_id}"))
    return results
