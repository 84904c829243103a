"""Scheduler service: one per instance, hosting one policy from ``sloserve.policies``."""
