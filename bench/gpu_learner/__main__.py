"""``python -m bench.gpu_learner``: see the package docstring."""
from bench.gpu_learner.cli import main

main()
