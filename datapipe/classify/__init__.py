"""Model-based quality scoring: the featuriser, fastText model loading and scoring, training, metrics."""
