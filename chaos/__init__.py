"""The chaos harness: the exactly-once promise measured under faults on a real store.

``python -m chaos.run`` starts a fleet of instance processes on one backend, injects
faults at random from a printed seed (:mod:`chaos.faults`), and judges the ledgers and the
store's history (:mod:`chaos.check`). See ``docs/chaos.md``.
"""
