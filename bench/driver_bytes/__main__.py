"""``python -m bench.driver_bytes``: see the package docstring."""
from bench.driver_bytes.cli import main

raise SystemExit(main())
