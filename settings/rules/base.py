"""What every rule shares: the one-line error, and the patterns more than one domain checks."""

from __future__ import annotations

import ipaddress
import re

from settings.model import SettingsError

KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/([0-9a-f-]{36}|mrk-[0-9a-f]{32})$")
SECRET_NAME = re.compile(r"^[\w/+=.@-]{1,512}$")


def ipv4_network(text: str) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(text)
    except ValueError:
        return None


def require(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise SettingsError(key, value, allowed)
