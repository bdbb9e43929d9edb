"""Small-model ablations over runs (``datapipe ablate``) and RegMix-style mixture search
(``datapipe mix-search``): see docs/ablate.md."""
