"""Trace-driven discrete-event simulator that drives any HAS policy."""
