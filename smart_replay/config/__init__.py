"""What a buffer is: its tables, rate limiters and the frozen `BufferConfig`.

`tables.TableConfig` (one table), `limiter` (rate limiters), `reverb_tables`
(a config as a `reverb.Table`), `buffer.BufferConfig` (the whole buffer) and
`record` (the config as a manifest stores and compares it).
"""
