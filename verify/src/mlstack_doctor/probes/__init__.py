"""Probes: each a small function (Context) -> Result. The order and the gating live in engine.py."""
