"""The gin configs shipped with smart_replay (installed as `smart_replay_configs`).

Binaries find them by name: `--gin_file=populate_thermal.gin`.
"""
