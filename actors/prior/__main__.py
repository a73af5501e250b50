"""``python -m actors.prior predict ...``: the offline CLI (``actors/prior/cli.py``)."""
import sys

from actors.prior.cli import main

sys.exit(main())
