"""What the bench scripts share: the harness, the sample corpus, the bench tokenizer, process-tree sampling."""
