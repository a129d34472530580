"""MARP: predicts per-GPU training memory and lists the GPU plans that fit."""
