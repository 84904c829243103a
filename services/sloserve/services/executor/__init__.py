"""Executor service: runs each ``BatchPlan`` on a backend (``sim`` or ``torch``)."""
