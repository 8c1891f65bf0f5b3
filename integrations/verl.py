"""Deprecated: ``grpo_curator_integrations.verl`` (this name is kept for one release)."""

import warnings

from grpo_curator_integrations import verl as _new

warnings.warn("'integrations.verl' is now 'grpo_curator_integrations.verl'; 'integrations' will be removed in the "
              "next release", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
