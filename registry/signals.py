"""Notices the registry raises for the regulator. Registry cannot import inspections (where alerts live), so it
sends a signal and ``inspections`` turns each notice into an alert on the ledger, in the same transaction.

``chip_notice(sender, kind, prover, serials, detail)``: ``kind`` an alert kind ("diverted", "lifecycle"),
``prover`` the organisation concerned (the chips' owner), ``serials`` the chips, ``detail`` a sentence.
"""

from django.dispatch import Signal

chip_notice = Signal()
