"""The control protocol of a standalone buffer server (`smart-replay-serve`).

What Reverb's port cannot carry (describe the buffer, write a verified
checkpoint, per-item sample counts, coordinated checkpoints) goes through
a small gRPC service of its own: `protocol` (its methods, limits and
encoding), `server` and `client` (the service and its client, with
deadlines and bounds), `access` (who may call it: tokens, TLS, the listening
address, protected mode), `credentials` (what a client presents and whom it
trusts), `tokens`, `certificates` and `private_files` (the files behind
them).
"""
