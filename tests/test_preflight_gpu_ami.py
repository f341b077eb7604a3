"""preflight: the GPU node group's pinned AMI release is published in the stack's region, read from the public
SSM parameter AWS publishes per release and region (tools/preflight/gpu_ami.py)."""

from __future__ import annotations

from typing import Any

from tests.support.aws_fakes import Answer, client_error
from tests.support.preflight_account import AMI_IMAGE, GOOD, ROLE, account, check, preflight
from tools.preflight.gpu_ami import CHECK

# The parameter of release 1.36.2-20260714 (the catalog's pin for the default Kubernetes 1.36), written out as the
# EKS user guide and amazon-eks-ami name it: the AMI name amazon-eks-node-al2023-x86_64-nvidia-1.36-v20260714.
PINNED = (
    "/aws/service/eks/optimized-ami/1.36/amazon-linux-2023/x86_64/nvidia/"
    "amazon-eks-node-al2023-x86_64-nvidia-1.36-v20260714/image_id"
)
LATER = PINNED.replace("v20260714", "v20260901")


def publishing(names: dict[str, tuple[str, ...]]) -> Answer:
    """GetParameter where only these AMI parameters exist, each in these regions; CDK's bootstrap version as ever."""

    def answer(params: dict[str, Any], region: str) -> dict[str, Any]:
        name = params["Name"]
        if not name.startswith("/aws/service/"):
            return {"Parameter": {"Name": name, "Value": "33"}}
        if region not in names.get(name, ()):
            return client_error("ParameterNotFound", "", 400)
        return {"Parameter": {"Name": name, "Value": AMI_IMAGE}}

    return answer


def test_the_pinned_release_published_in_the_region_passes() -> None:
    line = check(preflight(account(**{"ssm:GetParameter": publishing({PINNED: ("us-east-1",)})}), *GOOD), CHECK)
    assert line.status == "PASS", line
    assert "1.36.2-20260714" in line.detail and "us-east-1" in line.detail and AMI_IMAGE in line.detail


def test_a_release_missing_from_the_region_fails_before_the_cluster_is_built() -> None:
    answers = account(**{"ssm:GetParameter": publishing({PINNED: ("us-east-1",)})})
    line = check(preflight(answers, f"cluster_admin_arns={ROLE}", "region=eu-west-1", region="eu-west-1"), CHECK)
    assert line.status == "FAIL", line
    assert "1.36.2-20260714" in line.detail and "eu-west-1" in line.detail and "CreateNodegroup" in line.detail
    assert "gpu_ami_release_version" in line.fix and "--region eu-west-1" in line.fix


def test_a_release_the_user_sets_is_the_one_checked() -> None:
    answers = account(**{"ssm:GetParameter": publishing({LATER: ("us-east-1",)})})
    assert check(preflight(answers, *GOOD, "gpu_ami_release_version=1.36.4-20260901"), CHECK).status == "PASS"
    # The pinned one is not published in this account's region: the setting, not the pin, decides.
    assert check(preflight(answers, *GOOD), CHECK).status == "FAIL"


def test_a_parameter_that_is_not_an_image_id_fails() -> None:
    line = check(preflight(account(**{"ssm:GetParameter": {"Parameter": {"Value": "33"}}}), *GOOD), CHECK)
    assert line.status == "FAIL" and "not an image id" in line.detail


def test_denied_is_a_warning_naming_the_policy() -> None:
    line = check(preflight(account(**{"ssm:GetParameter": client_error("AccessDeniedException")}), *GOOD), CHECK)
    assert line.status == "WARN" and "GetParameter was denied" in line.detail and "iam-policy.json" in line.fix
