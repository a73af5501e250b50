"""``python -m actors.priors predict ...``: the offline CLI (``actors/priors/cli.py``)."""
import sys

from actors.priors.cli import main

sys.exit(main())
