"""HAS: the heterogeneity-aware scheduler and its baselines, behind one policy interface."""
