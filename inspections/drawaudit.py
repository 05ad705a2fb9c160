"""Compatibility entry point only: ``python -m inspections.drawaudit`` is ``python -m rules.draw_auditor``.

The outside draw audit lives in ``rules/draw_auditor.py`` (pure, no Django). This file keeps the
command line auditors already run (same arguments, same output, same exit status); add nothing here.
"""

import sys

from rules.draw_auditor import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m inspections.drawaudit"))
