"""Near-duplicate detection: shingles, MinHash signatures (datasketch-compatible), LSH clustering."""
