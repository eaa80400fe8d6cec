"""The stack's packages: the distributions whose versions the doctor checks against the profile and the
fleet report compares from one run to the next. Standard library only (see the package's docstring)."""

from __future__ import annotations

# By distribution name, in the order reports list them.
STACK = ("torch", "triton", "flash-linear-attention", "fla-core", "transformers")
