"""Model-based quality scoring: the featuriser, fastText and transformers model loading and scoring, training, metrics."""
