"""The leaves of a pipeline file: section models, record limits, input names. Imports nothing above storage."""
