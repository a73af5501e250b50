"""The learner: policy loss, batching, and DeepSpeed ranks as Ray actors.

Import submodules directly (``learner.config``, ``learner.loss``, ``learner.ranks``...):
this package imports nothing heavy so that config parsing stays fast.
"""
