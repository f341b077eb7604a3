"""The GPU node group's pinned AMI release is published in the stack's region.

EKS resolves a managed node group's releaseVersion in the node group's region at CreateNodegroup, after
the cluster is built: a release not (or no longer) published there fails the deploy half way. AWS
publishes each EKS optimized AMI release as a public SSM parameter per region (EKS user guide,
"Retrieve recommended Amazon Linux AMI IDs"), named after the AMI:
`/aws/service/eks/optimized-ami/<k8s>/amazon-linux-2023/x86_64/nvidia/amazon-eks-node-al2023-x86_64-nvidia-<k8s>-v<date>/image_id`
for the release `<k8s>.<patch>-<date>` (awslabs/amazon-eks-ami CHANGELOG.md, its Release version and AMI
name columns).
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from tools.preflight.base import Account, Result, error_code

CHECK = "GPU AMI release"
# The node group's AMI type AL2023_x86_64_NVIDIA (cdk_constructs/gpu_nodes.py), as the parameter path names it.
AMI_PATH = "amazon-linux-2023/x86_64/nvidia"
AMI_NAME = "amazon-eks-node-al2023-x86_64-nvidia"


def ami_parameter(kubernetes_version: str, release: str) -> str:
    """The public SSM parameter holding the image id of the AL2023 NVIDIA AMI of this release."""
    date = release.rsplit("-", 1)[1]
    return (
        f"/aws/service/eks/optimized-ami/{kubernetes_version}/{AMI_PATH}/"
        f"{AMI_NAME}-{kubernetes_version}-v{date}/image_id"
    )


def gpu_ami_release(account: Account) -> list[Result]:
    settings = account.settings
    release = settings.gpu_ami_release
    parameter = ami_parameter(settings.kubernetes_version, release)
    fix = (
        f"set gpu_ami_release_version to a release listed by `aws ssm get-parameters-by-path --region "
        f"{account.region} --path /aws/service/eks/optimized-ami/{settings.kubernetes_version}/{AMI_PATH}`"
    )
    try:
        image = account.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
    except ClientError as err:
        if error_code(err) == "ParameterNotFound":
            where = f"release {release} of the AL2023 NVIDIA AMI is not published in {account.region}"
            return [Result("FAIL", CHECK, f"{where} ({parameter} missing): CreateNodegroup would fail", fix)]
        raise
    if not image.startswith("ami-"):
        return [Result("FAIL", CHECK, f"{parameter} holds {image!r}, not an image id", fix)]
    return [Result("PASS", CHECK, f"release {release} is published in {account.region} ({image})")]
