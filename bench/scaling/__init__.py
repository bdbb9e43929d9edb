"""Cost and memory as the corpus or the cluster grows; docs/scaling.md is written from them."""
