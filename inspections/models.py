"""Inspections: campaigns, draws, assignments, findings, claims (issue 4)."""
