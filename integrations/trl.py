"""Deprecated: ``grpo_curator_integrations.trl`` (this name is kept for one release)."""

import warnings

from grpo_curator_integrations import trl as _new

warnings.warn("'integrations.trl' is now 'grpo_curator_integrations.trl'; 'integrations' will be removed in the "
              "next release", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
