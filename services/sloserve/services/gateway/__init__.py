"""Gateway service: validates, tokenizes, routes with the core ``Controller`` and streams tokens."""
