"""Compatibility entry point only: ``python -m ledger.verify`` is ``python -m tlog.log_verifier``.

The outside verifier lives in ``tlog/log_verifier.py`` (pure, no Django). This file keeps the command
line third parties already run (same arguments, same output, same exit status); add nothing here.
"""

import sys

from tlog.log_verifier import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m ledger.verify"))
