"""Deprecated: ``grpo_curator_integrations.openrlhf`` (this name is kept for one release)."""

import warnings

from grpo_curator_integrations import openrlhf as _new

warnings.warn("'integrations.openrlhf' is now 'grpo_curator_integrations.openrlhf'; 'integrations' will be removed in the "
              "next release", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
