"""The run: its start on running roles (``start``), the driver's step loop (``trainer``), the
held-out evaluation (``evaluation``), the watchdog over every blocking call (``watchdog``), and
the stop on a signal (``preempt``)."""
