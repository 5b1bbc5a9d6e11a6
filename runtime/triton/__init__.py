"""Triton engine glue: device weights, decode step, engine (docs/protocol.md)."""
