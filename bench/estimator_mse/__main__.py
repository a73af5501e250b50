"""``python -m bench.estimator_mse [--quick] [--rewards 0,1] [--out PATH]``"""
from bench.estimator_mse.cli import main

main()
