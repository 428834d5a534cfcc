"""InTune for TensorFlow: live tuning of tf.data pipelines."""
