"""Writes of the inspections app, by subject: campaigns, alerts, inspectors, sweeps, claims, bodies.

Each write is a ledger entry with its projection rows in the same transaction. Import the
subject's module (``from inspections.services import campaigns``); nothing is re-exported here.
"""
