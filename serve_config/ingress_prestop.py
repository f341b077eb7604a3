"""The ingress pods' preStop behind the internal NLB: wait while the NLB may still open connections, then until the
last open connection on the Serve port closes, at most the whole drain (settings.sizing.ingress_prestop_seconds).

POSIX sh and the shell's own builtins plus `sleep`: it runs in the serving image, where KubeRay runs `ray start`
under bash; it reads the pod's own /proc/net/tcp and tcp6 (the container's network namespace), so it needs no `ss`
or `netstat`. A line's fourth field is the state (01: ESTABLISHED), its second the local address and port in hex.
"""

from __future__ import annotations

import math

from settings import Settings
from settings.sizing import ingress_prestop_seconds
from settings.sizing.admission import INGRESS_PRESTOP_POLL_S, INGRESS_PRESTOP_QUIET_POLLS, ingress_prestop_min_seconds

_SCRIPT = """\
open_connections() {{
  n=0
  for table in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$table" ] || continue
    while read -r _slot address _remote state _rest; do
      if [ "$state" = 01 ] && [ "${{address##*:}}" = {port_hex} ]; then n=$((n + 1)); fi
    done < "$table"
  done
  echo "$n"
}}
sleep {minimum}
polls=0
quiet=0
while [ "$polls" -lt {max_polls} ]; do
  if [ "$(open_connections)" -eq 0 ]; then
    quiet=$((quiet + 1))
    if [ "$quiet" -ge {quiet_polls} ]; then exit 0; fi
  else
    quiet=0
  fi
  sleep {poll}
  polls=$((polls + 1))
done
"""


def prestop_script(settings: Settings, port: int, *, scale: float = 1.0) -> str:
    """The preStop's shell script for the Serve port; `scale` shrinks every sleep (for a test, never the stack).
    It lasts at least ingress_prestop_min_seconds and at most ingress_prestop_seconds (rounded up to a poll)."""
    minimum = ingress_prestop_min_seconds(settings)
    max_polls = math.ceil((ingress_prestop_seconds(settings) - minimum) / INGRESS_PRESTOP_POLL_S)
    return _SCRIPT.format(
        port_hex=f"{port:04X}",
        minimum=f"{minimum * scale:g}",
        max_polls=max_polls,
        quiet_polls=INGRESS_PRESTOP_QUIET_POLLS,
        poll=f"{INGRESS_PRESTOP_POLL_S * scale:g}",
    )
