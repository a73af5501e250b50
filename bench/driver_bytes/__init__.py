"""``python -m bench.driver_bytes``: the bytes of one step's batch that cross the driver,
with the samples inline (how batches went before: the coordinator's ``TrainBatch`` into the
driver, then each rank's shard out of it again) and by reference (the coordinator puts each
rank's shard in the object store; the driver holds the records, per-sample counts and the
references), at a config's batch shape.

The batch is synthetic, of the config's shape: ``rollout.batch_prompts`` prompts of
``algo.k_init`` samples each (the fewest a V0.5 prompt has), response lengths uniform in
[1, ``rollout.max_tokens``] (seeded), prompts of ``--prompt-tokens`` tokens. The bytes are
what Ray's serializer makes of each object (``SerializedObject.total_bytes``, in a local
Ray instance for the references), summed over what the driver receives and sends. A batch too
large to build here whole is measured on a 1/F slice of its prompts and scaled by F (bytes
add up per prompt and per sample); the result says F.
"""
