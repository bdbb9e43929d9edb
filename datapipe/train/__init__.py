"""The trainers behind ``datapipe train-tokenizer`` and ``datapipe train-classifier``."""
