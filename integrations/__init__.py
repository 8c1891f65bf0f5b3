"""Deprecated name of ``grpo_curator_integrations`` (kept for one release): ``import integrations`` warns.

The adapters moved to ``grpo_curator_integrations`` because a top-level ``integrations`` package clashes too
easily in a trainer's environment. ``integrations.verl``, ``.trl``, ``.openrlhf`` and ``._http`` re-export the
new modules' names, so old code and file paths (``--remote_rm_url integrations/openrlhf.py``) keep working.
"""

import warnings

warnings.warn("the package 'integrations' is now 'grpo_curator_integrations'; 'integrations' will be removed "
              "in the next release", DeprecationWarning, stacklevel=2)
