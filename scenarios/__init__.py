"""Scenarios: the chain of guarantees run end to end, from an empty database (``manage.py run_scenario``).

A harness, not an app: it plays the outside world (chips through ``replay.chipsim``, vendors,
provers, inspectors) against the system's services and API, and reads back the system's verdicts.
See docs/scenarios.md.
"""
