"""The read path: every dataset of a buffer, from its sources, in the graph.

One path for every kind of dataset: `dataset.make_dataset` turns *sources*
(`sources.Source`: a table on a server; the buffer's own, each shard of a
sharded buffer, a starter mixed in) into batches drawn by one batcher
(`batcher.Batcher`: each group's share of a batch, each source's mass within
its group, one multinomial per batch), whose sampled items became windows in
one place (`windows.Windows`: split, padded, cut from blocks) and are
decoded by the buffer's layout once per batch, beside a `ReplayInfo`
(`replay_info`: importance weights over each element's buffer). Also here:
how much of a batch a starter gets (`fraction_schedule`) and epochs over a
snapshot (`epochs`).
"""
