"""Compatibility entry point only: ``python -m ledger.witness`` is ``python -m tlog.log_witness``.

The witness lives in ``tlog/log_witness.py`` (pure, no Django). This file keeps the command line
witnesses already run (same arguments, same output, same exit status); add nothing here.
"""

import sys

from tlog.log_witness import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m ledger.witness"))
