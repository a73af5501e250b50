"""What a run asks for: the typed config (``schema``, its role and model ``sections``), the
checks of the model and the prompts before any actor starts (``preflight``), and where the
run's outputs go (``paths``)."""
