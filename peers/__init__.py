"""The island process: training loop, background gossip worker, partner choice, checkpoints."""
