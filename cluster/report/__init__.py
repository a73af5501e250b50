"""The run report, ``<run>/report.html``, from the run's files alone: ``python -m
cluster.report RUN_DIR`` (``page``), its sections, figures, reads and checks (``sections``,
``plots``, ``data``, ``analysis``)."""
