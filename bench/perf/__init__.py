"""Throughput benchmarks: a stage, reader, exporter or the loader against the library it wraps."""
