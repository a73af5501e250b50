"""The shared floor: what the roles exchange and the process plumbing they all use.

Typed messages and records (``types``, ``records``), weight-sync transports and payloads
(``weight_sync``), Ray process helpers (``rayproc``), thread and log set-up (``threads``,
``logs``) and atomic writes (``atomic``). ``actors/``, ``learner/`` and ``cluster/`` import it;
it imports none of them.
"""
