"""A frontend of several (``up --frontends N``, issue 33, items 1 and 5)."""
