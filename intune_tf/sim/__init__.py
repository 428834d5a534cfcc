"""Simulation: the pipeline simulator, pretraining and calibration (numpy only;
no TensorFlow at import).
"""
