"""Jobs across the pool: the job model, leases, placement, status, the job store and the three roles.

Pure core: ``model`` (specs, records, lifecycle, leases), ``plan``, ``messages``, ``placement``,
``status``.  I/O shell: ``store`` (files), ``context`` (what the roles share), ``submitter``,
``coordinator``, ``rank_host`` and ``orchestrator`` (the roles and their composition).  May import
``frenzyd.net`` for message types and the core of ``marp``/``has``; never ``frenzyd.node`` or
``frenzyd.api`` (the launcher and the inventory are injected by the daemon).
"""
