"""Gateway service: validates, tokenizes, routes (``sloserve.router``) and streams tokens."""
