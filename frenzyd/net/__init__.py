"""The pool's network layer: wire codec, trust (auth, TLS), election, peer table, transport, discovery.

Pure core: ``wire``, ``messages``, ``auth``, ``election``, ``peer_table``.  I/O shell: ``tls``,
``transport`` (server and client), ``dispatch``, ``heartbeats``, ``network`` (the facade the
daemon uses) and ``discovery`` (zeroconf).  May import ``frenzyd.errors`` and ``frenzyd.config``;
never ``frenzyd.jobs``, ``frenzyd.node`` or ``frenzyd.api``.
"""
