"""What is on disk: checkpoint folders, manifests, locks and the reader.

A buffer directory's layout (`layout`), durable writes (`durable`), the
manifest (`manifest`), the lock that keeps a second process out (`lock`),
moving Reverb's output into place (`store`, `files`, `foreign`) and reading
a checkpoint without a server (`reader`).
"""
