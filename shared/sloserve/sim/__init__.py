"""Discrete-event simulator: the live stack's policy objects, driven in virtual time."""
