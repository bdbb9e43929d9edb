"""Encoding, packing and the shard format. Empty on purpose: the loader imports ``tokens.shard_format`` alone
and must not pull in the tokenizers library."""
