"""This workstation: its GPU inventory (NVML or declared), the rank launcher and the rendezvous store.

All I/O shell.  May import ``frenzyd.errors``, ``frenzyd.gpu_types`` and ``frenzyd.config``; never
``frenzyd.net``, ``frenzyd.jobs`` or ``frenzyd.api``.
"""
