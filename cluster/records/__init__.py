"""What a run writes: the per-step and end-of-run figures (``metrics``), the run's files
(``files``: metrics.jsonl, prompts.jsonl, summary.json, ...), its checkpoints
(``checkpoints``), and W&B (``wandb_log``)."""
