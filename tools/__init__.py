"""Commands users run around their stack (python -m tools.NAME): preflight, plan, verify, bench, change
impact, the PR guard, hand-off. dev/ holds the maintainers' scripts; in_pod/ the code a tool sends into a pod."""
