"""The repository's root and the stack's name: the one place each is defined."""

from __future__ import annotations

from pathlib import Path

# settings/ sits directly under the repository root.
ROOT = Path(__file__).resolve().parent.parent
STACK_NAME = "PdInference"
