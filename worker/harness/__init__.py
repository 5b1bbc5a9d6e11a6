"""Trusted harness: the child driver script and the parent-side client that times it."""
