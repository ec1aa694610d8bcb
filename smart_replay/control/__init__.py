"""The control protocol of a standalone buffer server (`smart-replay-serve`).

What Reverb's port cannot carry (describe the buffer, write a verified
checkpoint, per-item sample counts, coordinated checkpoints) goes through
a small gRPC service of its own: `access` (who may call it: the token, TLS,
the listening address, protected mode) and `channel` (the service and its
client, with deadlines and bounds).
"""
