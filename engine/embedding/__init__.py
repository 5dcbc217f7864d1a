"""Embeddings and rerank scores from a loaded model's final hidden states: pooling, normalisation
and rank (classifier) heads."""
