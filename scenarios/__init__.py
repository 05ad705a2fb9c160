"""Scenarios: the chain of guarantees run end to end, from an empty database (``manage.py run_scenario``).

A harness, an app only for its commands (``seed_demo``, ``run_scenario``): it plays the outside world
(chips through ``replay.prover.chipsim``, vendors, provers, inspectors) against the system's services and API,
and reads back the system's verdicts. Nothing on the server imports it.
See docs/scenarios.md.
"""
