"""Feeds (shared): the inputs a model is run on, for verification and for the benchmarks alike.

Takes a model's graph inputs and what the user gives (shapes, arrays); gives feeds, name -> array:
synthesized from the graph's input specs (`synthesize`, its symbolic dims in `dims`, a
GroupQueryAttention decoder's KV cache in `kv_cache`), or given and checked against the graph
inputs (`given`). `sets` chooses the input sets a fold is checked on; `budget` bounds the memory
one synthesized input may take.
"""
