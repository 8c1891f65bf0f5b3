"""The ``grpo-curator`` command line, one module per command family (``main`` dispatches them).

``service.cli:main`` is the console script, and ``python -m service.cli`` runs it too.
"""

from service.cli.main import main

__all__ = ["main"]
