"""The rules of the world as pure functions: no Django, no database (docs/ARCHITECTURE.md, Parts).

``chip_lifecycle`` (what may happen to a chip, and who may do it), ``registry_world`` (what the registry's
entries make of the world), ``identifiers``, ``epcis_format`` (EPCIS 2.0 parse and render),
``sampling_plans`` (how many chips to inspect), ``inspection_planning`` (periods, a prover's sample,
assignment), ``draw_ranking`` (the draw's ranking, commitment and seed), ``draw_recompute`` (a draw
recomputed from ledger entries) and ``python -m rules.draw_auditor`` (the same from the public API; also
run as ``python -m inspections.drawaudit``). Imports only the standard library and ``tlog`` (and rfc8785, a dependency of ``tlog``).
"""
