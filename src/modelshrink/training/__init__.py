"""The training loop, the run around it, losses, students, classifiers, checkpoints, trackers."""
