"""What people and tools talk to: the local client API, the web status page and Prometheus metrics.

All I/O shell.  May import ``frenzyd.jobs`` (the orchestrator it serves) and ``frenzyd.errors``;
never ``frenzyd.net`` internals.
"""
