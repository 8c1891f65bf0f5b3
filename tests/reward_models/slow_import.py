"""A module that takes a second to import: a worker preloading it starts slowly (see test_pool)."""

import time

time.sleep(1.0)
