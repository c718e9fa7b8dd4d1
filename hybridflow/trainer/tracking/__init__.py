"""Tracking and plots: the step metrics, the trackers (console, file, TensorBoard, W&B, ...), the generations
logged and dumped, the summary table and the PNG curves."""
