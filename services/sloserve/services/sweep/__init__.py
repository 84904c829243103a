"""Declarative sweeps (issue 37): a YAML spec's cross product of simulations and capacity
searches, run as Ray tasks into one JSON-lines table, and a static report (docs/sweeps.md).

``spec`` expands a spec into cells (each the exact ``sloserve simulate``/``capacity``
command line it stands for), ``runner`` runs them on Ray, ``report`` draws the table.
"""
