"""Workloads: request-length traces, arrival processes and SLO mixes (``make_requests``)."""
