"""``python -m studies.estimator_mse [--quick] [--rewards 0,1] [--out PATH]``"""
from studies.estimator_mse.cli import main

main()
