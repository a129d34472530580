"""The pool's network layer: wire codec, trust (auth, TLS), election, peer table, transport, discovery.

Pure core (no I/O at import or inside): ``wire`` (the frame codec and the kind registry),
``messages`` (the typed heartbeat and its report), ``auth`` (credentials, signed orders),
``election`` (the coordinator state machine), ``peer_table`` (peers heard, addresses to dial).

I/O shell: ``tls`` (the mutual-TLS contexts), ``transport`` (the aiohttp server and client: one
frame each way), ``dispatch`` (decode a frame, check a signed order, run its handler, count what
is refused), ``heartbeats`` (the heartbeat loop, liveness, election ticks), ``network`` (the
``PeerNetwork`` facade the daemon uses, composing those three), ``discovery`` (zeroconf) and
``ratelog`` (rate-limited warnings for untrusted input).  Imports inside the shell run one way:
``network`` -> ``heartbeats`` -> ``transport`` -> ``dispatch``.

May import ``frenzyd.errors`` and ``frenzyd.config``; never ``frenzyd.jobs``, ``frenzyd.node`` or
``frenzyd.api``.
"""
