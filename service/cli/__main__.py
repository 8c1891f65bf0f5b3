"""``python -m service.cli``: the same as the ``grpo-curator`` console script."""

import sys

from service.cli.main import main

sys.exit(main())
